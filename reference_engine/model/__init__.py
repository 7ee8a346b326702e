"""The model: composition of ops only (embedding, gated attention, Gated DeltaNet, sparse MoE, norms, LM head)."""

from reference_engine.model.build import build_model, params_from_state_dict
from reference_engine.model.linear import Linear
from reference_engine.model.qwen3_5_moe import Qwen35MoeModel

__all__ = ["Linear", "Qwen35MoeModel", "build_model", "params_from_state_dict"]
