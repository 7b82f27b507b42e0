"""The options of one campaign that hold whatever runs it: one value, built once by the command line (or a
notebook, a benchmark, a test) and handed down to the loop and the executors, instead of each flag passed by
hand through every layer.

    from bbrlab.campaign.options import CampaignOptions
    run_campaign_on(spec, "runs/demo", options=CampaignOptions(retry_failed=True, progress=False))

The defaults are those of ``bbrlab campaign run`` without any of its flags.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CampaignOptions:
    """How a campaign runs, whatever its spec and wherever it runs (one testbed or several).

    Attributes
    ----------
    retry_failed : bool, default False
        Give runs whose attempts are used up ``max_attempts`` more (``--retry-failed``, after fixing the cause).
    allow_mixed : bool, default False
        Run even on another testbed, accelerator, sender vCPU count or sender kernel than the campaign's records
        ran on (``--allow-mixed``); every record made then says so (``metadata.mixed``).
    keep_link : bool, default False
        Leave the last link's qdiscs on the emulator(s) at the end (``--keep-link``).
    progress : bool, default True
        Show a progress bar (``--no-progress`` turns it off).
    max_consecutive_failures : int, default 5
        Stop the campaign (:class:`~bbrlab.campaign.loop.CampaignAborted`) after this many runs in a row failed
        every attempt: the testbed, not the scenario, is then the likely cause.
    """

    retry_failed: bool = False
    allow_mixed: bool = False
    keep_link: bool = False
    progress: bool = True
    max_consecutive_failures: int = 5


#: The options of ``bbrlab campaign run`` without flags: the default of every function that takes ``options``.
DEFAULT_OPTIONS = CampaignOptions()
