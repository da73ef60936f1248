"""A drop-in for `torch.distributed.tensor.debug.CommDebugMode`: change one import.

```
from hp_otel.torch import CommDebugMode  # was: from torch.distributed.tensor.debug import CommDebugMode
```
"""

from hp_otel.torch.comm_mode import CommDebugMode

__all__ = ["CommDebugMode"]
