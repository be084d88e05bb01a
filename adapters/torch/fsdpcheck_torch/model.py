"""The reference's models as the PyTorch code users train.

gpt2: `transformers.GPT2LMHeadModel` (the Hugging Face model code), eager
attention, gelu_new, every dropout 0, the LM head tied to wte.

llama: `transformers.LlamaForCausalLM`, eager attention, SiLU MLP, RMSNorm,
RoPE (default, rope_theta from the trace), grouped-query attention
(num_key_value_heads) with head_dim as the trace says (it need not be
hidden_size / num_attention_heads), no biases, no dropout; the LM head tied to
embed_tokens or not, as tie_word_embeddings says.

Both: the loss is the model's own causal-LM loss (`loss_function`, which
upcasts logits to fp32) on the trace's targets passed as `shift_labels`, so
every one of the B*T targets counts, as in the reference (docs/contract.md §2: input =
tokens[0:T], target = tokens[1:T+1]).

mlp: nn.Linear layers named `layers.{i}`, tanh-form GELU between them,
cross-entropy on the last layer's logits.

What differs between the Hugging Face models (their modules, classes and
attribute names) is one row of HF, keyed by model_type; the tie is the built
config's tie_word_embeddings.

LoRA (a model config with "fsdpcheck_lora", llama only): the llama above,
wrapped by `peft.get_peft_model` with a `LoraConfig` of the trace's r and
lora_alpha, no dropout, no bias, on exactly the module paths the reference
adapted (given to PEFT as a list of full paths: PEFT matches a string target
with re.fullmatch, the reference with a search anywhere in the path). PEFT's
parameter names map to the trace's by trace_name.
"""

import importlib
import sys
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .errors import UsageError


class MLP(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dims[i], dims[i + 1]) for i in range(len(dims) - 1))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.gelu(x, approximate="tanh")
        return x


def gpt2_config(m):
    from transformers import GPT2Config

    c = GPT2Config(
        vocab_size=m["vocab_size"],
        n_positions=m["n_positions"],
        n_embd=m["n_embd"],
        n_layer=m["n_layer"],
        n_head=m["n_head"],
        layer_norm_epsilon=m["layer_norm_epsilon"],
        activation_function="gelu_new",
        n_inner=None,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        tie_word_embeddings=True,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        loss_type="ForCausalLM",
    )
    c._attn_implementation = "eager"
    return c


# what the reference's llama is, beyond its sizes: a trace saying otherwise
# describes a model this adapter does not build (refused by name)
LLAMA_FIXED = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0,
    "rope_scaling": None,
}


def llama_config(m):
    import inspect

    import transformers
    from transformers import LlamaConfig

    for k, want in LLAMA_FIXED.items():
        if m.get(k, want) != want:
            raise ValueError(f"llama {k} {m[k]!r}: the reference's llama has {want!r}")
    kw = {
        k: m[k]
        for k in (
            "vocab_size",
            "max_position_embeddings",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
        )
    }
    theta = float(m["rope_theta"])
    # transformers 5 keeps RoPE's settings in rope_parameters (a top-level
    # rope_theta is converted into it); 4.x reads rope_theta
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    else:
        kw.update(rope_theta=theta, rope_scaling=None)
    kw.update(
        initializer_range=m.get("initializer_range", 0.02),
        tie_word_embeddings=bool(m["tie_word_embeddings"]),
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        pretraining_tp=1,
        use_cache=False,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    try:
        c = LlamaConfig(**kw)
    except Exception as e:  # transformers 5 validates: huggingface_hub's StrictDataclassError, no ValueError
        # e.g. 5.x refuses a hidden_size that is no multiple of num_attention_heads
        # even with head_dim given, which 4.x and the reference accept
        why = (str(e).strip().splitlines() or [type(e).__name__])[-1].strip()
        raise ValueError(f"transformers {transformers.__version__} refuses this llama config: {why}") from e
    c._attn_implementation = "eager"
    return c


@dataclass(frozen=True)
class HFModel:
    """A Hugging Face causal LM as fsdpcheck numbers it: the root unit holds
    the embedding, the final norm and the LM head; each block is a unit."""

    module: str  # the modeling module (imported before building on meta)
    cls: str  # the causal-LM class
    block: str  # the decoder block class: FSDP's unit
    config: object  # the trace's model dict -> the transformers config
    body: str  # the base model's attribute on the causal LM
    blocks: str  # the block list's attribute on the body
    embed: str  # the token embedding's attribute on the body
    norm: str  # the final norm's attribute on the body (the head stage starts there)
    attn: str  # the attention's attribute on a block (counts recomputed forwards)

    def model_class(self):
        return getattr(importlib.import_module(self.module), self.cls)

    def block_class(self):
        return getattr(importlib.import_module(self.module), self.block)

    def body_of(self, model):
        return getattr(model, self.body)


HF = {
    "gpt2": HFModel(
        "transformers.models.gpt2.modeling_gpt2",
        "GPT2LMHeadModel",
        "GPT2Block",
        gpt2_config,
        "transformer",
        "h",
        "wte",
        "ln_f",
        "attn",
    ),
    "llama": HFModel(
        "transformers.models.llama.modeling_llama",
        "LlamaForCausalLM",
        "LlamaDecoderLayer",
        llama_config,
        "model",
        "layers",
        "embed_tokens",
        "norm",
        "self_attn",
    ),
}


def hf(model_cfg):
    """model_cfg's Hugging Face row, or None (the mlp)."""
    return HF.get(model_cfg.get("model_type"))


def takes_token_ids(model_cfg):
    """Whether the model's input is token ids (an embedding), not features."""
    return hf(model_cfg) is not None


def embed_name(model_cfg):
    """The token embedding's parameter name (the tied LM head's), or None."""
    h = hf(model_cfg)
    return f"{h.body}.{h.embed}.weight" if h else None


# PeftModel.base_model (a LoraModel) holds the Hugging Face model as .model
PEFT_ROOT = "base_model.model."


def trace_name(n):
    """A parameter's (or module's) name as the reference's registry, the
    trace, writes it: PEFT's without its wrappers' prefix, and a LoRA layer's
    base linear (PEFT's `base_layer`) as the linear itself."""
    return n.removeprefix(PEFT_ROOT).replace(".base_layer.", ".")


def clean_name(n):
    """A wrapped model's parameter name as the trace writes it: without FSDP's and
    checkpointing's wrappers, and PEFT's names mapped (trace_name)."""
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_module.", "_orig_mod."):
        n = n.replace(wrapper, "")
    return trace_name(n)


def base_of(model):
    """The Hugging Face model inside PEFT's wrapper (model itself without one)."""
    if "peft" in sys.modules:
        from peft import PeftModel

        if isinstance(model, PeftModel):
            return model.get_base_model()
    return model


def lora_layers(model):
    """PEFT's LoRA layers of model, by trace module path (an FSDP-wrapped model's too)."""
    if "peft" not in sys.modules:
        return {}
    from peft.tuners.lora import LoraLayer

    return {clean_name(n): m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def lora_scalings(model):
    """The scalings PEFT's LoRA layers apply (their "default" adapter's), sorted, distinct."""
    return sorted({float(m.scaling["default"]) for m in lora_layers(model).values()})


def apply_lora(model, model_cfg, lora):
    """model (a llama) wrapped by peft.get_peft_model as a user applies LoRA (lora:
    the reference's lora.LoraSpec), checked against the reference's LoRA: the layers
    PEFT adapted and the scaling each applies (ValueError where PEFT's differ)."""
    try:
        import peft
    except ImportError as e:
        raise UsageError(f"--lora needs the peft package, which is not installed ({e}); requirements.lock pins it")
    targets = lora.modules(model_cfg)
    conf = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.lora_alpha,
        target_modules=targets,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft 0.21 asks transformers 5 for is_gradient_checkpointing, deprecated there (a FutureWarning
        # on every rank, nothing to act on here); every other warning still shows
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        model = peft.get_peft_model(model, conf)
    layers = lora_layers(model)
    if list(layers) != targets:
        raise ValueError(f"peft {peft.__version__} adapted {list(layers)}, the reference {targets}")
    want = lora.lora_alpha / lora.r  # the reference's lora_scale, a double like this float
    for path, layer in layers.items():
        if layer.scaling["default"] != want:
            raise ValueError(
                f"peft {peft.__version__} scales {path}'s adapter by {layer.scaling['default']!r}, the reference "
                f"by lora_alpha / r = {want!r}"
            )
        if not isinstance(layer.lora_dropout["default"], nn.Identity) or layer.use_dora.get("default"):
            raise ValueError(f"peft {peft.__version__} gives {path} dropout or DoRA, which the reference has not")
    return model


def build(model_cfg, lora=None):
    """A freshly constructed model (fp32, CPU); weights come from load_init.
    With lora (the model config's "fsdpcheck_lora" as a lora.LoraSpec, parsed
    where the config was read), PEFT's model around it (apply_lora)."""
    if lora is None and model_cfg.get("fsdpcheck_lora") is not None:
        raise ValueError('a model config with "fsdpcheck_lora" is built with its LoraSpec (lora.parse)')
    h = hf(model_cfg)
    if h is not None:
        model = h.model_class()(h.config(model_cfg))
        model.config._attn_implementation = "eager"
        return apply_lora(model, model_cfg, lora) if lora else model
    if model_cfg.get("model_type") == "fsdpcheck-mlp":
        return MLP(model_cfg["dims"])
    raise ValueError(f"unsupported model_type {model_cfg.get('model_type')!r}")


# The random fills a module's constructor draws its parameters with (torch.nn.init's
# and the tensor methods under them): what build_loaded skips, load_init then
# overwriting every parameter.
RANDOM_FILLS = frozenset(
    {
        "normal_",
        "uniform_",
        "trunc_normal_",
        "kaiming_normal_",
        "kaiming_uniform_",
        "xavier_normal_",
        "xavier_uniform_",
        "orthogonal_",
        "sparse_",
    }
)


class SkipRandomFills(torch.overrides.TorchFunctionMode):
    """Under it, a random fill of a tensor (RANDOM_FILLS, by name: torch.nn.init's
    functions and Tensor's methods alike, as transformers and torch call them)
    leaves the tensor as it is; `filled` holds the data pointers of the storages
    it left. Every other call runs as it would."""

    def __init__(self):
        super().__init__()
        self.filled = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in RANDOM_FILLS:
            # torch.nn.init's functions come here with the tensor as a keyword
            t = args[0] if args else kwargs.get("tensor")
            if isinstance(t, torch.Tensor):
                self.filled.add(t.untyped_storage().data_ptr())
                return t
        return func(*args, **kwargs)


def build_loaded(model_cfg, init, names, lora=None):
    """build() then load_init(), without the random draws of build()'s
    initialisation, which load_init overwrites (gpt2-124m's build: 124M normals
    on one thread, 1.4 s of each torch rank; 0.03 s without them).
    Buffers (RoPE's inv_freq, a causal mask) are computed as build() computes
    them: no random fill makes one. Where one did (a draw left on a storage no
    parameter holds and a buffer does), the model is built again with every
    draw made, so the model is always build()'s with the trace's weights."""
    mode = SkipRandomFills()
    with mode:
        model = build(model_cfg, lora)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    buffers = {b.untyped_storage().data_ptr() for b in model.buffers()}
    if (mode.filled - params) & buffers:
        model = build(model_cfg, lora)
    load_init(model, init, names)
    return model


def build_meta(model_cfg, lora=None):
    """build() on the meta device: the parameters' names and shapes, no memory.
    What it imports is imported first: torch 2.7 fails an import made under the
    meta device (transformers' modeling code, torch._dynamo through it)."""
    h = hf(model_cfg)
    if h is not None:
        importlib.import_module(h.module)
    if lora:
        try:
            importlib.import_module("peft")
        except ImportError:
            pass  # build says so, as one line
    with torch.device("meta"):
        return build(model_cfg, lora)


def unit_class(model_cfg):
    """The module class FSDP wraps as a unit (docs/contract.md §2 units)."""
    h = hf(model_cfg)
    return h.block_class() if h else nn.Linear


def unit_modules(model, model_cfg):
    """The unit submodules, in forward order."""
    h = hf(model_cfg)
    if h is not None:
        return list(getattr(h.body_of(base_of(model)), h.blocks))
    return list(model.layers)


def count_block_forwards(model, model_cfg):
    """A one-element list counting the forward calls inside every unit (a
    transformer: each block's attention; mlp: each layer), the evidence that
    activation checkpointing ran: every count doubles when the recompute runs
    the block again. A module inside the block, because transformers
    checkpoints the block's forward, not its __call__ (whose hooks would not
    run again)."""
    calls = [0]

    def count(module, args):
        calls[0] += 1

    h = hf(model_cfg)
    for u in unit_modules(model, model_cfg):
        (getattr(u, h.attn) if h else u).register_forward_pre_hook(count)
    return calls


def stage_modules(model, model_cfg):
    """(module, unit) per stage of the forward pass, as the reference numbers
    them (core/model.h): a transformer's embedding (the root unit 0), its
    blocks (units 1..L), its head (the root again, from the final norm); mlp's
    layers (units 0..). A stage's forward starts when its module's does."""
    h = hf(model_cfg)
    if h is not None:
        body = h.body_of(base_of(model))
        blocks = getattr(body, h.blocks)
        return [(getattr(body, h.embed), 0), *((b, i + 1) for i, b in enumerate(blocks)), (getattr(body, h.norm), 0)]
    return [(m, i) for i, m in enumerate(model.layers)]


def load_init(model, init, names):
    """Copies the trace's initial weights (name -> fp32 tensor) into the model.
    Every model parameter must be in `names` (a tied lm_head is the embedding,
    listed once under the embedding's name; PEFT's names as trace_name maps them)."""
    # deduplicated: a tied lm_head.weight is the embedding
    params = {trace_name(n): p for n, p in model.named_parameters()}
    missing = [n for n in names if n not in params]
    extra = [n for n in params if n not in names]
    if missing or extra:
        raise ValueError(f"model parameters do not match the trace: missing {missing[:3]}, extra {extra[:3]}")
    with torch.no_grad():
        for n in names:
            p = params[n]
            t = init[n]
            if tuple(p.shape) != tuple(t.shape):
                raise ValueError(f"{n}: shape {tuple(t.shape)} in the trace, {tuple(p.shape)} in the model")
            p.copy_(t)
    model = base_of(model)
    h = HF.get(getattr(getattr(model, "config", None), "model_type", None))
    if h is not None:  # the head is the embedding exactly when the config ties them (gpt2: always)
        emb = getattr(h.body_of(model), h.embed).weight
        if model.config.tie_word_embeddings:
            assert model.lm_head.weight is emb, f"the LM head is not tied to {h.embed}"
        else:
            assert model.lm_head.weight is not emb, f"the LM head is tied to {h.embed}, the trace's is its own"


def loss_of(model, model_cfg, inp, target):
    """The per-rank mean loss of one micro-batch, as the model computes it."""
    if takes_token_ids(model_cfg):
        out = model(input_ids=inp, labels=target, shift_labels=target)
        return out.loss
    logits = model(inp)
    return F.cross_entropy(logits.float(), target)
