"""The tiny Orpheus model served by a real vLLM: the token stream the orpheus
engine consumes is real, valid and varied.

The request is the one the engine makes (prompt ids from ``tokens.py`` over
the model's own tokenizer, ``stream``, ``return_token_ids``, Orpheus
sampling, stop at ``<end_of_speech>``), sent with a plain HTTP client."""

from __future__ import annotations

import json
from typing import Any

import httpx
import torch
from transformers import AutoTokenizer

from gateway.engines.orpheus import tokens
from gateway.engines.orpheus.codes import CodeMapper, audio_position
from tests_vllm.conftest import VllmServer
from tests_vllm.tiny_orpheus import TinyOrpheus

#: Orpheus' sampling defaults
SAMPLING: dict[str, Any] = {"temperature": 0.6, "top_p": 0.8, "repetition_penalty": 1.1}


def prompt(model: TinyOrpheus, text: str, voice: str = "tara") -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(model.folder)
    ids: list[int] = tokenizer(tokens.voice_text(voice, text))["input_ids"]
    return tokens.prompt_ids(ids)


def stream_completion(server: VllmServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The streamed chunks of one ``/v1/completions`` request."""
    chunks: list[dict[str, Any]] = []
    with httpx.stream(
        "POST", server.base_url + "/v1/completions", json=body, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks


def test_tokenizer_has_the_orpheus_layout(tiny_model: TinyOrpheus) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model.folder)
    assert len(tokenizer) == tokens.VOCAB_SIZE
    text = tokens.voice_text("tara", "Hello <laugh> there")
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokens.START_OF_TEXT
    assert all(i < tokens.START_OF_TEXT for i in ids[1:])  # plain text: no special ids
    # emotion tags are text, kept whole through a round trip
    assert tokenizer.decode(ids[1:]) == text
    assert "<laugh>" in tokenizer.decode(ids)
    names = tokenizer.convert_ids_to_tokens(
        [tokens.END_OF_TEXT, tokens.START_OF_SPEECH, tokens.END_OF_SPEECH, 128266, 156939]
    )
    assert names == [
        "<|eot_id|>",
        "<custom_token_1>",
        "<custom_token_2>",
        "<custom_token_10>",
        "<custom_token_28683>",
    ]
    # an id-layout prompt decodes to its specials, whole
    decoded = tokenizer.decode(prompt(tiny_model, "Hi <sigh>"))
    assert isinstance(decoded, str)
    assert decoded.startswith("<custom_token_3><|begin_of_text|>tara: Hi <sigh><|eot_id|>")
    assert decoded.endswith("<custom_token_4><custom_token_5><custom_token_1>")


def test_model_follows_the_chain_with_a_margin(tiny_model: TinyOrpheus) -> None:
    """The weights themselves (``transformers``, teacher-forced): after every
    chain token the successor leads every other id by ≥ 60 logits, so
    temperature 0.6 / top_p 0.8 / repetition penalty 1.1 cannot change it."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(tiny_model.folder, dtype=torch.bfloat16)
    ids = prompt(tiny_model, "Hello <laugh> there")
    sequence = torch.tensor([[*ids, *tiny_model.chain]])
    with torch.inference_mode():
        logits = model.eval()(sequence).logits[0, len(ids) - 1 : -1].float()
    assert logits.argmax(-1).tolist() == list(tiny_model.chain)
    top = logits.topk(2, dim=-1).values
    assert float((top[:, 0] - top[:, 1]).min()) >= 60


def test_vllm_streams_the_chain(vllm_server: VllmServer, tiny_model: TinyOrpheus) -> None:
    ids = prompt(tiny_model, "Hello <laugh> there")
    body = {
        "model": vllm_server.name,
        "prompt": ids,
        "stream": True,
        "return_token_ids": True,
        "stop_token_ids": [tokens.END_OF_SPEECH],
        "max_tokens": len(tiny_model.chain) + 50,
        **SAMPLING,
    }
    chunks = stream_completion(vllm_server, body)
    choices = [chunk["choices"][0] for chunk in chunks]
    assert choices[0]["prompt_token_ids"] == ids  # the first chunk carries the prompt
    streamed = [tid for choice in choices for tid in choice["token_ids"] or []]
    # the whole chain, ending with the stop token, and nothing after it
    assert streamed == list(tiny_model.chain)
    assert choices[-1]["finish_reason"] == "stop"
    assert choices[-1]["stop_reason"] == tokens.END_OF_SPEECH
    assert len(chunks) > 50  # streamed in many chunks, not one body

    mapper = CodeMapper()  # fed as the engine feeds it: everything before the stop token
    frames = [
        f
        for choice in choices
        for f in mapper.push(t for t in choice["token_ids"] or [] if t != tokens.END_OF_SPEECH)
    ]
    assert mapper.finish() == 0
    assert mapper.dropped_tokens == 0
    assert frames == list(tiny_model.frames)
    assert len(set(frames)) >= 50
    assert all(audio_position(t) is not None for t in tiny_model.audio_ids)
