"""System axis: wait at a group barrier, or drift asynchronously?

The loops (synchronous group barrier, asynchronous single-rollout queue, partial
rollout) and the rollout engines arrive with the trainer; this package holds their
typed settings so that recipes can name them today.
"""

from rlmap.system.params import SystemParams

__all__ = ["SystemParams"]
