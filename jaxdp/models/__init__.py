"""Flax models from the DP-SGD hyperparameter-tuning literature."""

from jaxdp.models.activations import ACTIVATIONS, TemperedSigmoid, get_activation
from jaxdp.models.layers import CONV_IMPLS, Conv2D, extract_patches, max_pool
from jaxdp.models.lora import LoRAConv, LoRADense, LoRADenseGeneral
from jaxdp.models.nets import (MLP, MODELS, LogisticRegression, OpacusMnistCNN,
                               PapernotSteinkeCNN, get_model)
from jaxdp.models.transformer import SelfAttention, TransformerClassifier

__all__ = [
    "ACTIVATIONS", "CONV_IMPLS", "MLP", "MODELS", "Conv2D", "LoRAConv", "LoRADense", "LoRADenseGeneral", "LogisticRegression",
    "OpacusMnistCNN", "PapernotSteinkeCNN", "SelfAttention", "TemperedSigmoid", "TransformerClassifier", "extract_patches",
    "get_activation", "get_model", "max_pool",
]
