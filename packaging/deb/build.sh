#!/bin/sh
# Builds target/ferroce_<version>_<arch>.deb with dpkg-deb from a staged tree (no debhelper):
#   /usr/lib/<multiarch>/libnccl-net-ferroce.so     where NCCL's dlopen("libnccl-net-ferroce.so")
#                                                   looks without LD_LIBRARY_PATH or ld.so.conf
#   /usr/bin/ferroce-doctor
#   /usr/lib/<multiarch>/ferroce/softroce/          libibverbs.so.1, softroce-ctl: off the
#                                                   loader's path on purpose (docs/install.md)
#   /usr/include/ferroce/                           the C headers
#   /usr/share/doc/ferroce/                         README.md, CHANGELOG.md, docs/, copyright
#   /usr/share/man/man1/ferroce-doctor.1.gz
# Depends is what dpkg-shlibdeps computes from the ELF files (glibc and libgcc_s only: 15-packages
# checks it). Expects the release binaries built (make deb builds them). No maintainer scripts:
# nothing to configure, and no library with a SONAME on the loader's path (no ldconfig trigger).
#   DEB_MAINTAINER   the Maintainer field (default: git's user.name <user.email>)
set -eu
cd "$(dirname "$0")/../.."
# shellcheck source=packaging/common.sh
. packaging/common.sh
version=$(ferroce_version)
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
maintainer=${DEB_MAINTAINER:-"$(git config user.name || echo ferroce) <$(git config user.email || echo ferroce@users.noreply.github.com)>"}
work=target/deb
root=$work/root
out=target/ferroce_${version}_${arch}.deb
rm -rf "$work"
mkdir -p "$root/DEBIAN"
umask 022
"${MAKE:-make}" --no-print-directory install DESTDIR="$PWD/$root" PREFIX=/usr LIBDIR="/usr/lib/$multiarch" >/dev/null
strip_elf "$root/usr/lib/$multiarch/libnccl-net-ferroce.so" "$root/usr/bin/ferroce-doctor" \
    "$root/usr/lib/$multiarch/ferroce/softroce/libibverbs.so.1" "$root/usr/lib/$multiarch/ferroce/softroce/softroce-ctl"

doc=$root/usr/share/doc/ferroce
install -d "$doc" "$root/usr/share/lintian/overrides"
install -m 644 README.md "$doc/"
[ ! -f CHANGELOG.md ] || install -m 644 CHANGELOG.md "$doc/"
if [ -d docs ]; then
    cp -r docs "$doc/docs"
    find "$doc/docs" -type d -exec chmod 755 {} + -o -type f -exec chmod 644 {} +
fi
install -m 644 packaging/deb/copyright "$doc/copyright"
install -m 644 packaging/deb/lintian-overrides "$root/usr/share/lintian/overrides/ferroce"
install -d "$root/usr/share/man/man1"
gzip -9n <packaging/deb/ferroce-doctor.1 >"$root/usr/share/man/man1/ferroce-doctor.1.gz"
chmod 644 "$root/usr/share/man/man1/ferroce-doctor.1.gz"
# A native package's changelog.gz (Debian policy 12.7), dated by the commit for reproducibility.
when=$(date -R -d "@$(git log -1 --format=%ct 2>/dev/null || date +%s)")
printf 'ferroce (%s) unstable; urgency=medium\n\n  * Release %s: see CHANGELOG.md and README.md in this directory.\n\n -- %s  %s\n' \
    "$version" "$version" "$maintainer" "$when" | gzip -9n >"$doc/changelog.gz"

# Depends: dpkg-shlibdeps reads debian/control of the current directory, so it runs in a scratch one.
shlib=$(mktemp -d)
trap 'rm -rf "$shlib"' EXIT
mkdir "$shlib/debian"
printf 'Source: ferroce\n\nPackage: ferroce\nArchitecture: any\n' >"$shlib/debian/control"
elves=$(find "$PWD/$root/usr" -type f \( -name '*.so*' -o -perm -u+x \) | sort)
# shellcheck disable=SC2086 # one argument per file
depends=$(cd "$shlib" && dpkg-shlibdeps -O $elves 2>"$shlib/err" | sed -n 's/^shlibs:Depends=//p')
if [ -z "$depends" ]; then
    echo "packaging/deb/build.sh: dpkg-shlibdeps computed no Depends" >&2
    cat "$shlib/err" >&2
    exit 1
fi
size=$(du -sk "$root/usr" | cut -f1)
sed -e "s|@VERSION@|$version|" -e "s|@ARCH@|$arch|" -e "s|@MAINTAINER@|$maintainer|" \
    -e "s|@INSTALLED_SIZE@|$size|" -e "s|@DEPENDS@|$depends|" packaging/deb/control.in >"$root/DEBIAN/control"
(cd "$root" && find usr -type f -exec md5sum {} + | sort -k 2) >"$root/DEBIAN/md5sums"
chmod 644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
dpkg-deb --root-owner-group --build "$root" "$out" >/dev/null
echo "built $out (Depends: $depends)"
