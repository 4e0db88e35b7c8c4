"""python -m ferroce COMMAND (also the `ferroce` script):

    env [--softroce]   print `export K=V` lines (shell-quoted) for NCCL to load the plugin:
                       eval "$(python -m ferroce env)"
    plugin-path        print the plugin's absolute path (the value of NCCL_NET_PLUGIN)
    softroce-dir       print the directory of softroce's libibverbs.so.1
    doctor [ARGS...]   run the bundled ferroce-doctor with ARGS; its exit status is ours
"""

import os
import shlex
import sys

import ferroce


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd == "env":
        if rest not in ([], ["--softroce"]):
            print(f"ferroce env: unknown arguments {' '.join(rest)} (only --softroce)", file=sys.stderr)
            return 2
        for key, value in ferroce.nccl_env(softroce=bool(rest)).items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    if cmd == "plugin-path" and not rest:
        print(ferroce.plugin_path())
        return 0
    if cmd == "softroce-dir" and not rest:
        print(ferroce.softroce_dir())
        return 0
    if cmd == "doctor":
        doctor = ferroce.doctor_path()
        sys.stdout.flush()
        # The doctor replaces this process: its exit status and signals are the caller's.
        os.execv(doctor, [doctor] + rest)
    print(f"ferroce: unknown command {' '.join(args)}\n\n{__doc__.strip()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
