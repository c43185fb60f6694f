"""The ``interp`` command line (entry point ``interp = interp.cli.main:main``)."""
