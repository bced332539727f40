"""Models for the measuring harness (``shardfeed bench`` / ``verify`` / ``tune``).

The harness needs a realistic training step to put behind a loader, not a good classifier. The
models here take ``float32 [B, 3, H, W]`` (already normalised on the device) and return logits
``[B, num_classes]``:

``tiny``
    A small CNN (three strided 3×3 convolutions, global average pooling, one linear layer); a few
    MFLOPs per image at 224 px, so on a CPU the step stays small next to the loader.
``resnet18`` / ``resnet50``
    The ResNet-18/50 architectures of He et al. (2016), as torchvision builds them (BasicBlock /
    Bottleneck with the stride on the 3×3 convolution). ``torchvision.models`` is used when it is
    installed; otherwise the same layers are built here with ``torch`` alone.
``none``
    No model at all: the step does nothing, so the measurement is the loader's ceiling.
``module:callable`` or ``path/to/file.py:callable``
    The user's own: the callable is called with ``num_classes=N`` when it takes that argument
    (else with no arguments) and must return a ``torch.nn.Module`` with the contract above.

``torch`` is imported lazily, inside the functions.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["MODEL_NAMES", "build_model", "tiny_cnn", "resnet18", "resnet50", "load_user_callable"]

logger = logging.getLogger(__name__)

#: The built-in model names (``module:callable`` is accepted besides these).
MODEL_NAMES = ("tiny", "resnet18", "resnet50", "none")


def tiny_cnn(num_classes: int = 1000) -> "torch.nn.Module":
    """A small CNN: 3 strided conv + BN + ReLU blocks (16, 32, 64 channels), pooling, linear.

    Args:
        num_classes: outputs of the last layer.

    Returns:
        A module mapping float ``[B, 3, H, W]`` (any H, W ≥ 8) to logits ``[B, num_classes]``.
    """
    from torch import nn

    def block(cin: int, cout: int) -> list:
        return [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(*block(3, 16), *block(16, 32), *block(32, 64),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))


def _resnet_classes():
    """Build the ResNet building blocks (a function so that torch is imported lazily)."""
    from torch import nn

    def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
        return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)

    def conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
        return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, cin: int, width: int, stride: int = 1, downsample: nn.Module | None = None):
            super().__init__()
            self.conv1, self.bn1 = conv3x3(cin, width, stride), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = conv3x3(width, width), nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin: int, width: int, stride: int = 1, downsample: nn.Module | None = None):
            super().__init__()
            cout = width * self.expansion
            self.conv1, self.bn1 = conv1x1(cin, width), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = conv3x3(width, width, stride), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = conv1x1(width, cout), nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self, block: type, layers: list[int], num_classes: int):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            self.layer1 = self._stage(block, 64, layers[0], 1)
            self.layer2 = self._stage(block, 128, layers[1], 2)
            self.layer3 = self._stage(block, 256, layers[2], 2)
            self.layer4 = self._stage(block, 512, layers[3], 2)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512 * block.expansion, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)

        def _stage(self, block: type, width: int, num_blocks: int, stride: int) -> nn.Sequential:
            downsample = None
            cout = width * block.expansion
            if stride != 1 or self.inplanes != cout:
                downsample = nn.Sequential(conv1x1(self.inplanes, cout, stride), nn.BatchNorm2d(cout))
            blocks = [block(self.inplanes, width, stride, downsample)]
            self.inplanes = cout
            blocks += [block(cout, width) for _ in range(1, num_blocks)]
            return nn.Sequential(*blocks)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return BasicBlock, Bottleneck, ResNet


def _torchvision_model(name: str, num_classes: int):
    try:
        import torchvision.models as tvm
    except Exception:  # not installed, or installed but broken (mismatched torch build)
        return None
    return getattr(tvm, name)(weights=None, num_classes=num_classes)


def resnet18(num_classes: int = 1000, *, use_torchvision: bool = True) -> "torch.nn.Module":
    """ResNet-18 (BasicBlock, [2, 2, 2, 2]); ``torchvision``'s when installed and ``use_torchvision``.

    Returns:
        A module mapping float ``[B, 3, H, W]`` to logits ``[B, num_classes]``; randomly initialised.
    """
    model = _torchvision_model("resnet18", num_classes) if use_torchvision else None
    if model is None:
        basic, _, resnet = _resnet_classes()
        model = resnet(basic, [2, 2, 2, 2], num_classes)
    return model


def resnet50(num_classes: int = 1000, *, use_torchvision: bool = True) -> "torch.nn.Module":
    """ResNet-50 (Bottleneck, [3, 4, 6, 3]); ``torchvision``'s when installed and ``use_torchvision``.

    Returns:
        A module mapping float ``[B, 3, H, W]`` to logits ``[B, num_classes]``; randomly initialised.
    """
    model = _torchvision_model("resnet50", num_classes) if use_torchvision else None
    if model is None:
        _, bottleneck, resnet = _resnet_classes()
        model = resnet(bottleneck, [3, 4, 6, 3], num_classes)
    return model


_BUILTIN: dict[str, Callable[[int], Any]] = {"tiny": tiny_cnn, "resnet18": resnet18, "resnet50": resnet50}


def load_user_callable(spec: str) -> Callable:
    """Resolve ``"package.module:callable"`` or ``"path/to/file.py:callable"``.

    Raises:
        ValueError: ``spec`` has no ``:``, or the module has no such attribute.
        ModuleNotFoundError / FileNotFoundError: the module or file does not exist.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"model {spec!r}: expected one of {', '.join(MODEL_NAMES)} or 'module:callable' "
                         "(e.g. 'mypkg.models:build' or 'models.py:build')")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise FileNotFoundError(f"model {spec!r}: {path} is not a file")
        mod_id = f"_shardfeed_user_model_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(mod_id, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_id] = module
        loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"model {spec!r}: {module_name} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"model {spec!r}: {attr} is not callable")
    return obj


def _accepts_num_classes(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "num_classes" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def build_model(name: str, num_classes: int) -> "torch.nn.Module | None":
    """Build a model by name (see the module docstring); ``"none"`` gives ``None``.

    Args:
        name: ``tiny``, ``resnet18``, ``resnet50``, ``none`` or ``module:callable``.
        num_classes: the dataset's number of classes (logits per image).

    Returns:
        A ``torch.nn.Module`` (float ``[B, 3, H, W]`` → ``[B, num_classes]``), or None for ``none``.

    Raises:
        ValueError: unknown name, or a user callable that does not return a ``torch.nn.Module``.
    """
    import torch

    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    key = name.strip().lower()
    if key == "none":
        return None
    if key in _BUILTIN:
        return _BUILTIN[key](num_classes)
    fn = load_user_callable(name.strip())
    model = fn(num_classes=num_classes) if _accepts_num_classes(fn) else fn()
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model
