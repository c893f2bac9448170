"""(Copied unchanged from shared/models/training/model.py.)

Tiny Llama-architecture byte-level decoder in plain torch.

Matches Hugging Face LlamaForCausalLM semantics: RMSNorm (float32), rotary
embeddings in the 'rotate_half' convention, grouped-query attention where query
head h reads KV head h // (n_heads // n_kv_heads), SwiGLU MLP, no biases,
untied lm_head. Parameter names equal HF Llama tensor names.
"""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab_size: int = 256
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 32
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_cos_sin(positions, head_dim, theta):
    """positions: LongTensor [T] -> cos, sin [T, head_dim] (HF Llama layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x, cos, sin):
    # x [B, H, T, D]; cos/sin [T, D]
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def qkv(self, x, cos, sin):
        B, T, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, chunk=512):
        """Causal self-attention over the whole sequence (training / prefill)."""
        B, T, _ = x.shape
        c = self.c
        G = c.num_attention_heads // c.num_key_value_heads
        q, k, v = self.qkv(x, cos, sin)
        # group query heads by KV head: [B, KV, G, T, D]
        q = q.view(B, c.num_key_value_heads, G, T, c.head_dim)
        scale = 1.0 / math.sqrt(c.head_dim)
        outs = []
        # block-causal: query chunk i only reads keys [0, end_i)
        for s in range(0, T, chunk):
            e = min(T, s + chunk)
            qs = q[:, :, :, s:e].reshape(B, c.num_key_value_heads, G * (e - s), c.head_dim)
            ks, vs = k[:, :, :e], v[:, :, :e]
            att = torch.matmul(qs, ks.transpose(-1, -2)) * scale  # [B, KV, G*(e-s), e]
            att = att.view(B, c.num_key_value_heads, G, e - s, e)
            mask = torch.ones(e - s, e, dtype=torch.bool).triu(s + 1)
            att = att.masked_fill(mask, float("-inf"))
            att = torch.softmax(att.float(), dim=-1).to(vs.dtype).view(B, c.num_key_value_heads, G * (e - s), e)
            o = torch.matmul(att, vs).view(B, c.num_key_value_heads, G, e - s, c.head_dim)
            outs.append(o)
        o = torch.cat(outs, dim=3).reshape(B, c.num_attention_heads, T, c.head_dim)
        o = o.transpose(1, 2).reshape(B, T, c.num_attention_heads * c.head_dim)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.model = Inner(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.apply(self._init)
        # scaled init of residual projections
        for n, p in self.named_parameters():
            if n.endswith("o_proj.weight") or n.endswith("down_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.num_hidden_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, chunk=512):
        T = ids.shape[1]
        cos, sin = rope_cos_sin(torch.arange(T), self.config.head_dim, self.config.rope_theta)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))
