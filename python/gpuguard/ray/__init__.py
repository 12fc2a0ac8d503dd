"""gpuguard in Ray: placements with one rank per GPU (``placement``), the per-group rendezvous actor the
ranks of a Ray job meet in (``store``), and the driver's who-sits-where table (``report``). Importing this
package never imports Ray; each module does so only when called."""

from .placement import RayPlacement, ray_placement
from .report import PlacementReport
from .setup_hook import setup

__all__ = ["PlacementReport", "RayPlacement", "ray_placement", "setup"]
