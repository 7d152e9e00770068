"""The ``upstream`` engine: speech from a pool of OpenAI-compatible servers
(vllm-omni, OpenAI, another gateway) relayed into the gateway's sessions."""
