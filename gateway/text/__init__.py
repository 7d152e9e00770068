"""Text to segments: where text may be cut (segmenter), when to cut early
(policy), and the segment pipeline to engine jobs (queue), for the WebSocket
and HTTP paths alike."""
