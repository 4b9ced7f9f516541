"""The library's refusals: errors whose message says everything a user needs (what, where, fix).

Each is a :class:`UserError` (one line, no traceback needed) and a built-in exception of its kind, so that code
catching ``ValueError`` or ``TypeError`` still catches it. docs/pytorch.md ("What is refused") lists them."""


class UserError(Exception):
    """Mixed into the library's exceptions whose message is complete in one line: front-ends report them
    without a traceback (the fairseq plugin's command-line tools print ``COMMAND: error: MESSAGE``)."""


class ArgumentError(UserError, ValueError):
    """An argument of a call or a constructor of the wrong type, shape or value (a ``padding_mask`` of
    another shape, ``x`` of rank 2, a non-positive size, an unknown ``kernel``): the message names the
    argument, what was given, what is expected."""


class MisuseError(UserError, ValueError):
    """An object the user holds (a :class:`~posattn.DecodingCache`, a side's options, a layer's method, a
    batch's context) used where it does not belong (another layer, another batch, another side): the message
    names the object and its right use."""


def described(value: object) -> str:
    """What was given, as a refusal names it: a tensor's shape and dtype, else the value's type."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"a tensor of shape {tuple(shape)} and dtype {dtype}"
    return f"a {type(value).__name__}"
