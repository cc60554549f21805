"""_errors.py - the one exception class of the lmk package, so that a caller catches lmk's errors with one
`except lmk.LmkError`.

LmkError subclasses ValueError, so code written against `except ValueError` keeps working. liblmk's own
failures carry its lmk_status name and lmk_last_error()'s message; the package's argument checks raise
LmkError too, with status LMK_ERR_INVALID_ARGUMENT and a message naming the op and the argument. An argument
of the wrong type raises LmkTypeError, which is an LmkError and also a TypeError (`except TypeError` keeps
working for those). This module imports nothing of the package, so every other module can raise them.
"""


class LmkError(ValueError):
    """A failure of an lmk call: .status is the lmk_status name (e.g. "LMK_ERR_INVALID_ARGUMENT"), .message
    (also str(e)) the text naming the op, the value and the rule (lmk_last_error()'s for liblmk's checks)."""

    def __init__(self, message, status="LMK_ERR_INVALID_ARGUMENT"):
        super().__init__(message)
        self.message = message
        self.status = status

    def __repr__(self):
        return "%s(%r, status=%r)" % (type(self).__name__, self.message, self.status)


class LmkTypeError(LmkError, TypeError):
    """An argument of a type lmk does not take (an object without __dlpack__, a dtype lmk lacks, a string
    where a number goes): an LmkError that is also a TypeError."""
