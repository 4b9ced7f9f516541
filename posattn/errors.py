"""The library's refusals: errors whose message says everything a user needs (what, where, fix)."""


class UserError(Exception):
    """Mixed into the library's exceptions whose message is complete in one line: front-ends report them
    without a traceback (the fairseq plugin's command-line tools print ``COMMAND: error: MESSAGE``)."""
