"""The cases of each kernel file, by op family: FILES maps a .cu file to the function
that makes its cases and the signatures its library wraps (harness.SIGS)."""

from __future__ import annotations

from harness import SELFTEST_SIGS, SIGS
from .attention import cases_attention
from .deltanet import cases_deltanet
from .elementwise import cases_elementwise, cases_norm, cases_rope, cases_rows
from .quant import cases_dequant, cases_embedding, cases_matvec, cases_matvec_packed
from .sample import cases_sample
from .selftest import cases_selftest


FILES = {
    "selftest.cu": (cases_selftest, SELFTEST_SIGS),
    "elementwise.cu": (cases_elementwise, SIGS["elementwise.cu"]),
    "rows.cu": (cases_rows, SIGS["rows.cu"]),
    "norm.cu": (cases_norm, SIGS["norm.cu"]),
    "rope.cu": (cases_rope, SIGS["rope.cu"]),
    "embedding.cu": (cases_embedding, SIGS["embedding.cu"]),
    "dequant.cu": (cases_dequant, SIGS["dequant.cu"]),
    "matvec.cu": (cases_matvec, SIGS["matvec.cu"]),
    "matvec_packed.cu": (cases_matvec_packed, SIGS["matvec_packed.cu"]),
    "attention.cu": (cases_attention, SIGS["attention.cu"]),
    "sample.cu": (cases_sample, SIGS["sample.cu"]),
    "deltanet.cu": (cases_deltanet, SIGS["deltanet.cu"]),
}
