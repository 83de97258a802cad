"""One module per command: the pipeline a command runs, from its inputs to one typed result.
The command line (bcgtune/cli/commands) and the Python API (bcgtune/api.py) call these, so
both make the same decisions."""
