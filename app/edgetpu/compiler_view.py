"""What the Edge TPU plug-in adds to GET /v1/models: the compiler's view of a model any backend
serves from a parsed graph (which operators edgetpu_compiler would map into its one subgraph, what its
operator table would say of each, which verdicts no measured compiler output confirms), and the model's
estimated Edge TPU latency from model.json. The JSON shapes are
declared here so that the plug-in, not the core, fixes them."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.edgetpu.compat import CompatReport


class OpViewOut(BaseModel):
    index: int
    opcode: str
    on_edgetpu: bool = Field(description="inside the single partition edgetpu_compiler would map")
    supported: bool = Field(description="the operator itself meets the Edge TPU's constraints")
    reason: str | None = Field(description="the constraint it breaks, when it does not")
    status: str = Field(description="what edgetpu_compiler's operator table would say of it, in its own words "
                                    "(\"Mapped to Edge TPU\", \"More than one subgraph is not supported\", ...)")
    unsure: str | None = Field(description="why no measured compiler output confirms the verdict; null when one "
                                           "does (docs/edgetpu-compiler.md)")


class AdviceOut(BaseModel):
    topic: str
    ops: list[int] = Field(description="the operators concerned")
    finding: str
    change: str = Field(description="what to change in the model for more of it to map")
    source: str


class EdgeTpuViewOut(BaseModel):
    summary: str
    mapped: int = Field(description="operators the Edge TPU would run: every one it can take that does not depend on "
                                    "one the CPU runs after its part")
    total: int
    as_intended: bool = Field(description="every operator the Edge TPU could run is mapped; only the host's edges "
                                          "(a float input's QUANTIZE, a detector's post-processing) run on the CPU")
    first_unsupported: OpViewOut | None
    ops: list[OpViewOut]
    unsure: list[OpViewOut] = Field(default=[], description="the operators placed on the Edge TPU on a verdict no "
                                                            "measured compiler output confirms")
    advice: list[AdviceOut] = Field(default=[], description="known traps the model falls into (SiLU, a large "
                                                            "TRANSPOSE, a DFL decode in the graph, ...)")


def compiler_view(report: CompatReport) -> dict:
    """The analysis as /v1/models shows it (the report's rendering, to the declared keys)."""
    return EdgeTpuViewOut.model_validate(report.to_dict()).model_dump(mode="json")
