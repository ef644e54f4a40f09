"""Text that is safe to show on an admin's terminal.

Job names, comments, users, partitions and Slurm's own messages are written by users: a
name may carry escape sequences (``ESC ] 0;...BEL`` retitles the window, ``ESC [ ... m``
recolours or hides text, OSC 8 makes links, ``CSI`` in its one-byte C1 form ``0x9b``),
other control characters (a carriage return overwrites what was printed before it), or
Unicode format characters (bidi overrides such as U+202E reorder what follows).  Every
place that prints such text for a human (``status``, ``plan``, ``explain``, warnings,
console log lines, systemd's ``STATUS=``) passes it through ``safe_text`` first.

The rule is Python's own ``str.isprintable``: anything it does not call printable (the
Unicode categories Cc, Cf, Cs, Co, Cn, Zl, Zp and every Zs but the space) is shown as its
escape, ``\\x1b``, ``\\u202e``, so that the admin sees that it was there.  JSON output needs
no such step: ``json.dumps`` escapes it already.

Standard library only: ``slurm-elastic --help`` imports the command modules that use it.
"""

from __future__ import annotations


def safe_text(value: object, *, multiline: bool = False) -> str:
    """``str(value)`` with every non-printable character shown as its escape.

    ``multiline`` keeps line feeds (a traceback in a console log line); a table cell or
    one line of output never keeps them.
    """
    text = str(value)
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() or (multiline and ch == "\n") else _escape(ch) for ch in text
    )


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
