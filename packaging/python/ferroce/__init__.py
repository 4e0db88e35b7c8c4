"""Where the ferroce NCCL network plugin, ferroce-doctor and softroce are in this package.

    import os, ferroce
    os.environ.update(ferroce.nccl_env())   # NCCL_NET_PLUGIN = the plugin's absolute path

Each path function returns an absolute path inside the installed package and raises
FileNotFoundError if the file is not there (a broken install), rather than a path NCCL would
fail to load later with a vaguer message.
"""

import os

from ._version import __version__

__all__ = ["__version__", "plugin_path", "softroce_dir", "doctor_path", "nccl_env"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def _existing(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"ferroce package is incomplete: {path} is missing")
    return path


def plugin_path():
    """Absolute path of libnccl-net-ferroce.so, the value for NCCL_NET_PLUGIN."""
    return _existing(os.path.join(_HERE, "lib", "libnccl-net-ferroce.so"))


def softroce_dir():
    """Directory of softroce's libibverbs.so.1 and softroce-ctl.

    softroce is a userspace RoCEv2 NIC for hosts without RDMA hardware; it is used only when this
    directory comes first on LD_LIBRARY_PATH (nccl_env(softroce=True)), never by default.
    """
    return os.path.dirname(_existing(os.path.join(_HERE, "softroce", "libibverbs.so.1")))


def doctor_path():
    """Absolute path of the ferroce-doctor executable."""
    return _existing(os.path.join(_HERE, "bin", "ferroce-doctor"))


def nccl_env(softroce=False):
    """The environment variables to export for NCCL to load this plugin, as a dict.

    NCCL_NET_PLUGIN is the plugin's absolute path. With softroce=True, LD_LIBRARY_PATH also puts
    softroce's directory before the current LD_LIBRARY_PATH, so the plugin's dlopen of
    libibverbs.so.1 finds softroce instead of rdma-core's.
    """
    env = {"NCCL_NET_PLUGIN": plugin_path()}
    if softroce:
        rest = os.environ.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = softroce_dir() + (":" + rest if rest else "")
    return env
