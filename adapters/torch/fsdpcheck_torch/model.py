"""The reference's models as the PyTorch code users train.

gpt2: `transformers.GPT2LMHeadModel` (the Hugging Face model code), eager
attention, gelu_new, every dropout 0, the LM head tied to wte. Loss: the
model's own causal-LM loss (`loss_function`, which upcasts logits to fp32) on
the trace's targets passed as `shift_labels`, so every one of the B*T targets
counts, as in the reference (DESIGN §2: input = tokens[0:T], target =
tokens[1:T+1]).

mlp: nn.Linear layers named `layers.{i}`, tanh-form GELU between them,
cross-entropy on the last layer's logits.
"""

import torch
import torch.nn.functional as F
from torch import nn


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


def build(model_cfg):
    """A freshly constructed model (fp32, CPU); weights come from load_init."""
    kind = model_cfg.get("model_type")
    if kind == "gpt2":
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel(gpt2_config(model_cfg))
        model.config._attn_implementation = "eager"
        return model
    if kind == "fsdpcheck-mlp":
        return MLP(model_cfg["dims"])
    raise ValueError(f"unsupported model_type {kind!r}")


def build_meta(model_cfg):
    """build() on the meta device: the parameters' names and shapes, no memory.
    What it imports is imported first: torch 2.7 fails an import made under the
    meta device (transformers' GPT-2 modeling, torch._dynamo through it)."""
    if model_cfg.get("model_type") == "gpt2":
        import transformers.models.gpt2.modeling_gpt2  # noqa: F401
    with torch.device("meta"):
        return build(model_cfg)


def unit_class(model_cfg):
    """The module class FSDP wraps as a unit (DESIGN §2 units)."""
    if model_cfg.get("model_type") == "gpt2":
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        return GPT2Block
    return nn.Linear


def unit_modules(model, model_cfg):
    """The unit submodules, in forward order."""
    if model_cfg.get("model_type") == "gpt2":
        return list(model.transformer.h)
    return list(model.layers)


def count_block_forwards(model, model_cfg):
    """A one-element list counting the forward calls inside every unit (gpt2:
    each block's attention; mlp: each layer), the evidence that activation
    checkpointing ran: every count doubles when the recompute runs the block
    again. A module inside the block, because transformers checkpoints the
    block's forward, not its __call__ (whose hooks would not run again)."""
    calls = [0]

    def count(module, args):
        calls[0] += 1

    for u in unit_modules(model, model_cfg):
        (u.attn if model_cfg.get("model_type") == "gpt2" else u).register_forward_pre_hook(count)
    return calls


def stage_modules(model, model_cfg):
    """(module, unit) per stage of the forward pass, as the reference numbers
    them (core/model.h): gpt2's embedding (the root unit 0), its blocks (units
    1..L), its head (the root again); mlp's layers (units 0..). A stage's
    forward starts when its module's does."""
    if model_cfg.get("model_type") == "gpt2":
        t = model.transformer
        return [(t.wte, 0), *((b, i + 1) for i, b in enumerate(t.h)), (t.ln_f, 0)]
    return [(m, i) for i, m in enumerate(model.layers)]


def load_init(model, init, names):
    """Copies the trace's initial weights (name -> fp32 tensor) into the model.
    Every model parameter must be in `names` (the tied lm_head is wte)."""
    params = dict(model.named_parameters())  # deduplicated: lm_head.weight is wte
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
    if hasattr(model, "lm_head"):
        assert model.lm_head.weight is model.transformer.wte.weight, "the LM head is not tied to wte"


def loss_of(model, model_cfg, inp, target):
    """The per-rank mean loss of one micro-batch, as the model computes it."""
    if model_cfg.get("model_type") == "gpt2":
        out = model(input_ids=inp, labels=target, shift_labels=target)
        return out.loss
    logits = model(inp)
    return F.cross_entropy(logits.float(), target)
