"""Keys of skein's key-value store shared by the YARN backend and its launcher container."""

SPEC_KEY = "launcher/spec"
SECRET_KEY = "launcher/secret"
INFO_KEY = "launcher/info"
OUT_KEY = "launcher/out/"
EXIT_KEY = "launcher/exit"
STOP_KEY = "launcher/stop"
