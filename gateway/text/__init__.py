"""Text to segments to audio: where text may be cut (segmenter), when to cut
early (policy), the segment queue to engine jobs (queue), and the delivery
pipeline that reads each job as resampled audio and classifies its failure
(pipeline), for the WebSocket and HTTP paths alike."""
