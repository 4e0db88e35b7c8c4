"""Fake torch.cuda: one device, synchronous."""


def device_count():
    return 1


def is_available():
    return True


def set_device(i):
    pass


def synchronize(dev=None):
    pass


def get_device_name(i=0):
    return "fake GPU"


class nccl:  # noqa: N801
    @staticmethod
    def version():
        return (2, 21, 5)
