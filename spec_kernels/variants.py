"""Which compiled variant of a Triton kernel each launch needs, and how many this process has met.

Triton compiles a kernel once per specialisation of its arguments: every constexpr's value, each
tensor's dtype and whether its address is 16-byte aligned, each integer's width (32 or 64 bits),
whether it is divisible by 16, and an integer equal to 1 as a constant (unless the kernel lists it
in `do_not_specialize`). The first launch of a new specialisation compiles (0.6-3 s a variant on an
H200), which inside a timed 25 ms step is a spoiled measurement. A caller counts the variants first
met while it timed something (`variants_met`): on a GPU from Triton's own per-device caches of the
kernels registered here (each compiled variant, or one loaded from Triton's disk cache, is an
entry), at no cost to a launch; under the CPU interpreter, which compiles nothing, by keying every
launch by those same rules (`specialisation`, checked against Triton's own `native_specialize_impl`
in the tests).
"""
from __future__ import annotations

import inspect

_met: set[tuple] = set()          # interpreted launches' keys
_compiled: list = []               # JIT kernels whose own caches count their variants


def variants_met() -> int:
    """Distinct kernel variants launched in this process so far (each one a compile on a GPU)."""
    return len(_met) + sum(len(entry[0]) for kernel in _compiled for entry in kernel.device_caches.values())


def integer_specialisation(value: int, specialise: bool) -> tuple:
    """Triton's key for an integer argument: its width, and unless told not to, 1 as a constant
    and a divisibility-by-16 hint."""
    width = "i32" if -2 ** 31 <= value < 2 ** 31 else ("u64" if value >= 2 ** 63 else "i64")
    if not specialise:
        return (width, None)
    if value == 1:
        return ("constexpr", 1)
    return (width, "D" if value % 16 == 0 else "")


def argument_specialisation(value, specialise: bool) -> tuple:
    """Triton's key for one non-constexpr argument (integer, float, bool, tensor, or None)."""
    if isinstance(value, bool):
        return ("u1", None)
    if isinstance(value, int):
        return integer_specialisation(value, specialise)
    if isinstance(value, float):
        return ("fp32", None)
    if value is None:
        return ("constexpr", None)
    dtype = str(value.dtype).removeprefix("torch.")
    aligned = None if not specialise else "D" if value.data_ptr() % 16 == 0 else ""
    return (f"*{TRITON_DTYPES.get(dtype, dtype)}", aligned)


# torch's dtype names as Triton's signatures spell them.
TRITON_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
                 "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "u1"}


class KernelVariants:
    """A @triton.jit kernel registered for `variants_met`: compiled, counted by its own caches;
    interpreted, by `note_launch`, which keys a launch from the kernel's argument names and those it
    does not specialise."""

    def __init__(self, kernel, do_not_specialize: tuple[str, ...] = ()):
        parameters = inspect.signature(kernel.fn).parameters.values()
        self.name = kernel.fn.__name__
        self.arguments = [p.name for p in parameters if "constexpr" not in str(p.annotation)]
        self.do_not_specialize = frozenset(do_not_specialize)
        # Triton's JITFunction keeps {device: (compiled kernels by key, ...)}; its interpreter none.
        self.compiled = isinstance(getattr(kernel, "device_caches", None), dict)
        if self.compiled:
            _compiled.append(kernel)

    def specialisation(self, args: tuple, constexprs: dict) -> tuple:
        """The launch's compile key: each argument's specialisation, then the constexprs."""
        if len(args) != len(self.arguments):
            raise ValueError(f"{self.name} takes {len(self.arguments)} runtime arguments, {len(args)} given")
        keys = tuple(argument_specialisation(value, name not in self.do_not_specialize)
                     for name, value in zip(self.arguments, args))
        return (self.name, keys, tuple(sorted(constexprs.items())))

    def note_launch(self, args: tuple, constexprs: dict) -> None:
        """Under the interpreter, key the launch (about 25 us of Python: never on a compiled path)."""
        if not self.compiled:
            _met.add(self.specialisation(args, constexprs))
