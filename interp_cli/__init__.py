"""The ``interp`` command line (entry point ``interp = interp_cli.main:main``)."""
