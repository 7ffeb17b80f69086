"""The network suite's ports (127.0.0.1 only) and file prefix: 5580-5589,
/tmp/fenced_lock_tests/n_*."""

MAIN_PORT = 5580         # the shared server: one database per test
LOSSY_PORT = 5581        # the slow, lossy link's server
LOSSY_PROXY_PORT = 5582  # its proxy
