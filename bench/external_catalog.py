"""The models written elsewhere that bench/external_models.py checks, and how to build each.

Every model is built from code alone (``pretrained=False``, or a transformers config), so
nothing is downloaded. A catalog entry says which library builds the model, the keyword
arguments that shrink it where the model allows (a smaller input resolution, a smaller
config), and the example input. Models whose structure fixes a large input (attention
biases or window partitions sized by the resolution) keep their own resolution.

Nothing here imports torch at module level, so the orchestrator stays light.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelEntry", "CATALOG", "build"]


@dataclass(frozen=True)
class ModelEntry:
    """One model: ``source`` (torchvision / timm / transformers), the constructor's name,
    its keyword arguments, and the input (an image size, or a token count)."""

    name: str
    source: str
    constructor: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    image: int = 128            # square RGB image of this side, batch 1
    tokens: int = 0             # > 0: a transformers model fed (1, tokens) token ids

    def __post_init__(self) -> None:
        if self.source not in ("torchvision", "timm", "transformers"):
            raise ValueError(f"ModelEntry {self.name!r}: unknown source {self.source!r}")
        if self.source == "transformers" and self.tokens <= 0 and "image" not in self.kwargs:
            raise ValueError(f"ModelEntry {self.name!r}: a transformers model needs tokens")


def _tv(name: str, image: int = 128, **kwargs: Any) -> ModelEntry:
    return ModelEntry(f"tv/{name}", "torchvision", name, kwargs, image)


def _timm(name: str, image: int = 128, **kwargs: Any) -> ModelEntry:
    return ModelEntry(f"timm/{name}", "timm", name, kwargs, image)


# Small transformers configs: two layers, width 64, four heads, a 1000-token vocabulary.
_SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              vocab_size=1000, max_position_embeddings=64)


def _hf(name: str, config: str, model: str, tokens: int = 16, **kwargs: Any) -> ModelEntry:
    return ModelEntry(f"hf/{name}", "transformers", model, {"config": config, **kwargs},
                      image=0, tokens=tokens)


_ENTRIES = [
    # torchvision: classification models, at 128×128 where the model allows it
    _tv("resnet18"), _tv("resnet50"), _tv("resnext50_32x4d"), _tv("wide_resnet50_2", 96),
    _tv("alexnet", 96), _tv("vgg11_bn", 64),
    _tv("mobilenet_v2"), _tv("mobilenet_v3_small"), _tv("mobilenet_v3_large"),
    _tv("efficientnet_b0"), _tv("efficientnet_v2_s", 96),
    _tv("regnet_x_400mf"), _tv("regnet_y_400mf"),
    _tv("convnext_tiny", 96),
    _tv("vit_b_16", 64, image_size=64), _tv("swin_t", 224), _tv("swin_v2_t", 256),
    _tv("maxvit_t", 224),
    _tv("densenet121", 224),
    _tv("inception_v3", 299, aux_logits=False, init_weights=True),
    _tv("googlenet", 96, aux_logits=False, init_weights=True),
    _tv("squeezenet1_0"), _tv("squeezenet1_1"),
    _tv("shufflenet_v2_x0_5"), _tv("shufflenet_v2_x1_0"),
    _tv("mnasnet0_5"), _tv("mnasnet1_0"),
    # timm: its own families, at 128×128 (or the resolution the model fixes)
    _timm("resnet18d"), _timm("resnet26t"), _timm("resnetv2_50", 96), _timm("seresnext26d_32x4d", 96),
    _timm("res2net50_26w_4s", 96), _timm("skresnet18"), _timm("cspresnet50", 96),
    _timm("dla34"), _timm("dpn68", 96), _timm("selecsls42b", 96),
    _timm("ese_vovnet19b_dw"), _timm("hrnet_w18_small", 96),
    _timm("efficientnet_b0"), _timm("tf_efficientnet_lite0"), _timm("mixnet_s", 224),
    _timm("mobilenetv3_small_100"), _timm("mobilenetv4_conv_small"),
    _timm("tinynet_a"), _timm("lcnet_050"), _timm("ghostnet_100"), _timm("rexnet_100"),
    _timm("fbnetc_100"), _timm("hardcorenas_a"), _timm("semnasnet_050"), _timm("spnasnet_100"),
    _timm("regnetx_002"), _timm("regnety_002"),
    _timm("repvgg_a0", 224), _timm("mobileone_s0"), _timm("repvit_m1"), _timm("fastvit_t8", 256),
    _timm("convnext_atto"), _timm("edgenext_xx_small", 128), _timm("efficientformer_l1", 224),
    _timm("mobilevit_xxs", 128), _timm("levit_128s", 224),
    _timm("vit_tiny_patch16_224", 96, img_size=96), _timm("deit_tiny_patch16_224", 96, img_size=96),
    _timm("cait_xxs24_224", 96, img_size=96), _timm("xcit_nano_12_p16_224", 224),
    _timm("swin_tiny_patch4_window7_224", 224), _timm("pvt_v2_b0"),
    _timm("coat_lite_tiny", 224), _timm("poolformer_s12"), _timm("convmixer_768_32", 64),
    _timm("mixer_s16_224", 96, img_size=96), _timm("resmlp_12_224", 96, img_size=96),
    _timm("gmlp_ti16_224", 96, img_size=96), _timm("visformer_tiny", 224),
    _timm("efficientvit_b0"), _timm("efficientvit_m0", 224), _timm("tiny_vit_5m_224", 224),
    _timm("maxvit_nano_rw_256", 256), _timm("gcvit_xxtiny", 224), _timm("nest_tiny", 224),
    _timm("crossvit_tiny_240", 240), _timm("hgnetv2_b0"), _timm("starnet_s1"),
    _timm("inception_next_tiny", 96),
    # transformers: random weights from small configs, token ids in, last hidden state out
    _hf("bert", "BertConfig", "BertModel", **_SMALL),
    _hf("roberta", "RobertaConfig", "RobertaModel", **{**_SMALL, "max_position_embeddings": 80}),
    _hf("distilbert", "DistilBertConfig", "DistilBertModel", dim=64, n_layers=2, n_heads=4,
        hidden_dim=128, vocab_size=1000, max_position_embeddings=64),
    _hf("albert", "AlbertConfig", "AlbertModel", embedding_size=32, **_SMALL),
    _hf("electra", "ElectraConfig", "ElectraModel", embedding_size=32, **_SMALL),
    _hf("gpt2", "GPT2Config", "GPT2Model", n_embd=64, n_layer=2, n_head=4, vocab_size=1000,
        n_positions=64),
    _hf("t5_encoder", "T5Config", "T5EncoderModel", d_model=64, d_kv=16, d_ff=128, num_layers=2,
        num_heads=4, vocab_size=1000),
    _hf("llama", "LlamaConfig", "LlamaModel", **_SMALL, num_key_value_heads=2),
    _hf("opt", "OPTConfig", "OPTModel", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        ffn_dim=128, vocab_size=1000, max_position_embeddings=64, word_embed_proj_dim=64),
    _hf("mobilebert", "MobileBertConfig", "MobileBertModel", hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, embedding_size=32, intra_bottleneck_size=32,
        true_hidden_size=32, vocab_size=1000, max_position_embeddings=64),
]

CATALOG: dict[str, ModelEntry] = {}
for _entry in _ENTRIES:
    if _entry.name in CATALOG:
        raise ValueError(f"external_catalog: {_entry.name!r} is listed twice")
    CATALOG[_entry.name] = _entry


def build(entry: ModelEntry):
    """``(model, inputs)`` for ``entry``: the module (float32, eval mode) and its example
    input tuple. Imports the entry's library."""
    import torch

    if entry.source == "torchvision":
        import torchvision

        model = torchvision.models.get_model(entry.constructor, weights=None, **entry.kwargs)
    elif entry.source == "timm":
        import timm

        model = timm.create_model(entry.constructor, pretrained=False, **entry.kwargs)
    else:
        model = _HiddenState(_transformers_model(entry))
        ids = torch.randint(5, 900, (1, entry.tokens), dtype=torch.long)
        return model.eval(), (ids,)
    image = torch.randn(1, 3, entry.image, entry.image)
    return model.eval(), (image,)


def _transformers_model(entry: ModelEntry):
    import transformers

    kwargs = dict(entry.kwargs)
    config = getattr(transformers, kwargs.pop("config"))(**kwargs)
    # The eager attention path, as written in the model's own module (not SDPA).
    config._attn_implementation = "eager"
    return getattr(transformers, entry.constructor)(config)


def _hidden_state_module():
    import inspect

    import torch

    class HiddenState(torch.nn.Module):
        """A transformers model as a tensor-in, tensor-out module: token ids to the last
        hidden state (no cache, no dict output)."""

        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner
            accepted = inspect.signature(inner.forward).parameters
            self.options = {"use_cache": False} if "use_cache" in accepted else {}

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids, return_dict=True,
                              **self.options).last_hidden_state

    return HiddenState


def _HiddenState(inner):  # noqa: N802 (a class made on first use, so torch loads lazily)
    return _hidden_state_module()(inner)
