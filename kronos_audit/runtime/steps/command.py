"""The command line a manifest records for replay, without the credentials in it.

A manifest is signed and kept for ever, committed to git and copied to DVC remotes, so the
recorded command line must not carry a password or token the program was started with
(``--api-key=...``, a URL with userinfo). Such arguments are recorded as ``***``
(:func:`kronos_audit._internal.secrets.scrub_command`) and a warning says which; a program
that needs them to re-run declares the command to record instead (``ka.Run(command=[...])``),
reading the secret from its environment at run time.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from kronos_audit._internal.secrets import scrub_command, scrub_urls
from kronos_audit.errors import UsageError

log = logging.getLogger("kronos_audit.runtime")


def recorded_command(declared: Sequence[str] | None = None) -> tuple[str, ...]:
    """What a manifest records as the command that re-runs the segment: ``declared``
    (``Run(command=...)``) as it is but for the credentials of URLs in it, else ``python``
    and this process's ``sys.argv`` with every credential-looking argument replaced by
    ``***`` (said once, as a warning)."""
    if declared is not None:
        if isinstance(declared, str) or not all(isinstance(a, str) for a in declared):
            raise UsageError("command must be a list of strings (an argv, not one string)")
        # The program's own word, also where a rule on option names errs; but not a
        # URL's password, which the manifest would sign and keep for ever.
        urls = scrub_urls(declared)
        if urls.scrubbed:
            log.warning(
                "the declared command carried a URL's credentials (%s): they are recorded "
                "as ***; read them from the environment at run time",
                ", ".join(urls.scrubbed),
            )
        return urls.argv
    scrubbed = scrub_command(["python", *sys.argv])
    if scrubbed.scrubbed:
        log.warning(
            "the recorded command line carried what looks like credentials (%s): it is "
            "recorded with *** in their place, so a replay cannot pass them; declare the "
            "command to record with ka.Run(command=[...]) and read secrets from the "
            "environment",
            ", ".join(scrubbed.scrubbed),
        )
    return scrubbed.argv
