"""The model zoo: every model is ``head(extractor(x))`` (see :mod:`.base`) and runs under
``torch.func.functional_call`` + ``vmap`` with per-client stacked parameters and buffers.

Importing this package registers every model; ``build_model(name, input_shape,
num_classes, options)`` builds one, ``MODELS`` lists them.
"""

from . import (  # noqa: F401  (imported to register the models)
    colored_mnist_cnn,
    dfl_cnn,
    fedavg_cnn,
    lenet,
    logistic,
    perceptron,
    resnet,
)
from .base import FedModel
from .layers import batchnorm_keys
from .registry import MODELS, build_model, register_model

__all__ = ["MODELS", "FedModel", "batchnorm_keys", "build_model", "register_model"]
