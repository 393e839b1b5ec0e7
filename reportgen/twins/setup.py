"""Everything the checks share: the task, seeded twins from one built model, the fixed batch.

Every check asks for fresh twins, so one check's side effects (counters, running stats,
RNG draws) never leak into the next one's measurements. The user's factory runs once per
process (:mod:`reportgen.twins.template`); a twin is a copy of that one build.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from reportgen.config import Config, RecomputeMode
from reportgen.errors import SetupError
from reportgen.results.distance import tolerances
from reportgen.rng import held
from reportgen.tasks import Batch, batch_to
from reportgen.twins.lazy import has_lazy, materialise_lazy
from reportgen.twins.recompute import (
    Wrapped,
    apply_recompute,
    effective_mode,
    guard_returned_leaves,
    is_model_switch,
    switch_on,
)
from reportgen.twins.step import TrainingStep, training_step
from reportgen.twins.template import NoInitialiser, Template, materialise, on_meta, one_build
from reportgen.twins.twin import TrainStep, Twin

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: ``precision.autocast`` values and their dtypes.
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
log = logging.getLogger("reportgen")
#: :attr:`Setup.batch` before the pipeline draws the fixed batch (after the task contract is probed).
NOT_DRAWN: Batch = ((), ())


@dataclass(frozen=True)
class Setup:
    """The run's shared inputs, frozen: each stage that finds something returns a new Setup
    (:func:`dataclasses.replace`: the drawn batch, what observation saw), never writes into this one.

    Attributes:
        config: the composed config as its schema's dataclasses (``OmegaConf.to_object``, made once by
            :func:`build_setup`; the ``DictConfig`` stays with the pipeline and the rank launcher):
            a check reads its own section typed, e.g. ``section: ParityConfig = setup.config.parity``;
            ``model``, ``task`` are dicts.
        task: the instantiated task (see :class:`reportgen.tasks.Task`).
        training_step: whose training step every twin takes, chosen once
            (:func:`reportgen.twins.step.training_step`).
        device: where both twins run.
        dtype: precision of both twins.
        template: the one build of the user's model every twin copies
            (:class:`reportgen.twins.template.Template`).
        wrapped: modules the recompute twin wraps (path and class).
        batch: the fixed parity batch ``(inputs, targets)`` on ``device``.
        observed: modules seen recomputing in the recompute twin (None: not observed).
        baseline_recomputes: modules seen recomputing in the plain twin (must be empty).
        compile_error: why ``torch.compile`` could not run the twins (None when it could or is off).
        nothing_recomputes: why the model's own switch is judged inert (it ran, and no module of the
            recompute twin runs its forward again in backward); None when something recomputes. A
            finding, not a usage error: the pipeline adds it as a FAIL row.
        mode: the recompute mode in force (``RecomputeMode.non_reentrant``, ``reentrant``, ``selective``; None when
            ``recompute.mode`` is unset and the switch did not say), worked out once
            (:func:`reportgen.twins.recompute.effective_mode`): what the report, metadata and diagnosis read.
        mode_note: None when ``recompute.mode`` was set; else e.g. "the model's own default (use_reentrant=True)".
        architecture: the plain model's class, ``module.QualName`` (e.g.
            ``transformers.models.qwen3.modeling_qwen3.Qwen3ForCausalLM``); what page 1 names.
        task_rng: ``{attribute: state}`` of every ``torch.Generator`` the task holds, as built: every twin
            starts from these (:meth:`build` puts them back), so the twins' steps draw alike from the task's own
            stream wherever a check runs them (:func:`reportgen.rng.drawn_from` for twins stepped in turn).
    """

    config: Config
    task: Any
    training_step: TrainingStep
    device: torch.device
    dtype: torch.dtype
    template: Template
    wrapped: list[Wrapped]
    batch: Batch
    observed: list[str] | None = None
    baseline_recomputes: list[str] = field(default_factory=list)
    compile_error: str | None = None
    nothing_recomputes: str | None = None
    mode: RecomputeMode | None = None
    mode_note: str | None = None
    architecture: str = ""
    task_rng: dict[str, torch.Tensor] = field(default_factory=dict)

    def build(self, recompute: bool, compiled: bool = True, meta: bool = False) -> nn.Module:
        """A fresh twin, a copy of the one build on the run's device (the factory never runs
        again: :meth:`reportgen.twins.template.Template.twin`); ``recompute`` turns recomputation on
        (wraps the targets, or calls the model's own switch) and guards its forward
        (:func:`reportgen.twins.recompute.guard_returned_leaves`). Under ``precision.autocast`` every
        forward runs in ``torch.autocast``; with ``compile.enabled`` the twin is compiled
        (``nn.Module.compile``, parameter names unchanged) unless ``compiled=False``. The generators the task
        holds are put back to their states as built (:attr:`task_rng`). ``meta``: a meta-device build stays on the
        meta device (the caller spreads it, then :func:`reportgen.twins.template.materialise` gives each shard its
        values); otherwise it is materialised whole on the run's device."""
        model = self.template.twin(torch.device("meta") if meta and on_meta(self.template.module) else self.device)
        for name, g in held(self.task).items():  # the task's own generators, as built: each twin starts alike
            if name in self.task_rng:
                g.set_state(self.task_rng[name])
        if recompute:
            apply_recompute(model, self.config.recompute)
            guard_returned_leaves(model)  # a region that returned its own parameter: raise, never recurse
        if self.autocast_dtype is not None:
            model.forward = autocast_forward(model.forward, self.device.type, self.autocast_dtype)
        if self.config.compile.enabled and compiled:
            model.compile(backend=self.config.compile.backend)
        return model.train()

    def twin(self, recompute: bool, compiled: bool = True, optimizer: Any = None, lr_scale: float = 1.0) -> Twin:
        """A fresh :class:`reportgen.twins.twin.Twin`: :meth:`build` with the run's training step, its optimizer
        (``optimizer``: a ``_target_`` node, default ``parity.optimizer``; the task's own where it makes one)
        with every learning rate times ``lr_scale``, and its scheduler."""
        optimizer = self.config.parity.optimizer if optimizer is None else optimizer
        return Twin.of(self.build(recompute, compiled), self.training_step, optimizer, lr_scale)

    def train_step(self, recompute: bool, compiled: bool = True, batch: Batch | None = None) -> TrainStep:
        """A representative training step of a fresh twin, callable (:class:`reportgen.twins.twin.TrainStep`): what
        the memory and time checks measure, with ``budget.optimizer`` on ``batch`` (default the fixed batch),
        seeded with ``forward_seed``."""
        twin = self.twin(recompute, compiled, optimizer=self.config.budget.optimizer)
        return TrainStep(twin, self.batch if batch is None else batch, self.config.forward_seed)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The ``torch.autocast`` dtype of every forward, or None (``precision.autocast: null``)."""
        name = self.config.precision.autocast
        return None if name is None else AUTOCAST[name]

    def tolerance(self) -> tuple[float | None, float | None]:
        """``(rtol, atol)`` for parity, the one place they are resolved for the run: configured values,
        else (under autocast) torch.testing's defaults for the autocast dtype, else None (each tensor's own
        dtype decides: :func:`reportgen.results.distance.tolerances`)."""
        rtol, atol = self.config.parity.rtol, self.config.parity.atol
        return (rtol, atol) if self.autocast_dtype is None else tolerances(self.autocast_dtype, rtol, atol)

    def make_batch(self, batch_size: int, seed: int) -> Batch:
        """A task batch of ``batch_size`` examples drawn with ``seed``, on device."""
        generator = torch.Generator().manual_seed(seed)
        return batch_to(self.task.make_batch(generator, batch_size), self.device, self.dtype)


def rebuilt_said(because: str) -> str:
    """One sentence saying why every twin calls the model's factory again, and how to build once."""
    return (
        f"every twin calls the model's factory again instead of copying one build: {because}. Exact, but the "
        "initialisation is repeated for every twin (slow for a large model); register hooks as bound methods "
        "of the module, keep uncopyable objects (locks, open files) off it and let copy.deepcopy copy it (no "
        "__deepcopy__ that returns the model itself or a new one), so one build is copied"
    )


def autocast_forward(forward, device_type: str, dtype: torch.dtype):
    """``forward`` run under ``torch.autocast(device_type, dtype)`` (recomputation replays the
    autocast state it recorded, torch.utils.checkpoint docs)."""

    def autocast_forward(*args, **kwargs):
        with torch.autocast(device_type=device_type, dtype=dtype):
            return forward(*args, **kwargs)

    return autocast_forward


def resolve_device(name: str) -> torch.device:
    """``auto`` → cuda when available, else cpu.

    Raises:
        SetupError: cuda asked for where there is none.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SetupError("device=cuda but torch sees no CUDA device; use device=cpu or device=auto")
    return torch.device(name)


def in_dtype(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``model`` with its real floating parameters and buffers in ``dtype`` (in place; ties stay ties). Complex ones
    stay complex: ``nn.Module.to(dtype)`` would cast them to ``dtype`` and drop their imaginary part."""
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.is_floating_point():
            t.data = t.data.to(dtype)
    return model


def _instantiate_model(
    cfg: DictConfig, task: Any, dtype: torch.dtype, keep_meta: bool = False
) -> tuple[Template, nn.Module]:
    """The one call of the user's factory in this process, seeded with ``cfg.seed``; the model is
    converted to ``dtype`` where the factory left it (twins are copied to the run's device). A model the factory
    built on the meta device is materialised on the host here, once (:func:`reportgen.twins.template.materialise`,
    seeded with ``cfg.seed``), unless ``keep_meta`` (a rank of a sharded run: each twin is materialised per shard,
    after it is spread). Returns the :class:`Template` and a host copy to probe the recompute settings on
    (:func:`reportgen.twins.template.one_build`)."""
    factory = get_method(cfg.model._target_)
    params = inspect.signature(factory).parameters
    extra = {"task": task} if "task" in params else {}

    def build() -> nn.Module:
        torch.manual_seed(cfg.seed)
        model = instantiate(cfg.model, **extra)
        if not isinstance(model, nn.Module):
            raise SetupError(
                f"model._target_={cfg.model._target_} returned {type(model).__name__}, not a torch.nn.Module"
            )
        if on_meta(model) and not keep_meta:
            materialise(model, torch.device("cpu"), int(cfg.seed))
        if has_lazy(model):  # before the one build is kept: a copy of an uninitialised module is not a build
            fixed = task.make_batch(torch.Generator().manual_seed(int(cfg.seed)), int(cfg.parity.batch_size))
            materialise_lazy(model, batch_to(fixed, torch.device("cpu"), torch.get_default_dtype())[0])
        return in_dtype(model, dtype)

    return one_build(build(), int(cfg.seed), build)


def build_setup(cfg: DictConfig, keep_meta: bool = False) -> Setup:
    """Instantiate the task and model and apply the recompute settings to a probe (the first stage). ``keep_meta``:
    a model built on the meta device stays there (a rank of a sharded run materialises each twin per shard).

    Only builds: ``cfg``'s values were refused or accepted before any model work, by the one validator
    (:func:`reportgen.commands.validation.config_problems`). The fixed batch is drawn after the task
    contract is probed, and the twins are observed after that: both are the pipeline's own stages
    (``reportgen.commands.run.prepare``), so this module never reaches up to the contract probe or the measurements.

    Raises:
        SetupError: model/task cannot be imported or built, or a device torch does not see.
        reportgen.twins.recompute.RecomputeConfigError: targets match nothing, bad save_ops, ...
    """
    config: Config = OmegaConf.to_object(cfg)  # the schema's dataclasses, once
    device, dtype = resolve_device(config.device), DTYPES[config.dtype]
    try:
        task = instantiate(cfg.task)
        template, probe = _instantiate_model(cfg, task, dtype, keep_meta)
    except SetupError:
        raise
    except NoInitialiser as exc:
        raise SetupError(str(exc)) from None
    except Exception as exc:  # ImportError, TypeError from a wrong kwarg, ...
        if isinstance(exc.__cause__, SetupError):  # Hydra wraps what a factory raises; ours says the fix
            raise exc.__cause__ from None
        raise SetupError(
            f"could not build model/task from the config: {exc}. Check model._target_, task._target_ "
            "and that your code is importable (PYTHONPATH)."
        ) from exc
    model, rc = template.module, config.recompute
    if is_model_switch(rc):
        wrapped, reported = [], switch_on(probe, rc)
    else:
        wrapped, reported = apply_recompute(probe, rc), None
    mode, mode_note = effective_mode(rc, reported)
    if template.rebuilt_because:
        log.warning("%s", rebuilt_said(template.rebuilt_because))
    return Setup(
        config,
        task,
        training_step(task),
        device,
        dtype,
        template,
        wrapped,
        batch=NOT_DRAWN,
        mode=mode,
        mode_note=mode_note,
        architecture=f"{type(model).__module__}.{type(model).__qualname__}",
        task_rng={name: g.get_state() for name, g in held(task).items()},
    )
