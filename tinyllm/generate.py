"""The seed's ``tinyllm.generate``: solo generation and the one-row sampler, where the seed's
code imports them (``from tinyllm.generate import sample_next``).

The package also exports the function ``tinyllm.generate``; this module is made callable so the
name means the same thing whichever was imported first (importing a submodule rebinds the
package attribute of the same name to the module)."""

import sys
import types

from tinyllm.engine.sampler import sample_next
from tinyllm.engine.solo import generate, generate_stream

__all__ = ["generate", "generate_stream", "sample_next"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return generate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
