"""``hybrid serve``: a resident server that keeps the toolkit warm behind the command line.

The pieces: ``wire`` (frames, the socket's path; standard library only), ``client`` (the
``hybrid`` console entry: forwards a command, or runs it in process), ``daemon`` (the server
process: socket, workers, idle exit), ``worker`` (a warm process that runs forwarded commands
through the same Click entry point), ``pool`` (pre-created one-shot sandboxes per tier, image
and spec). Importing this package loads nothing.
"""
