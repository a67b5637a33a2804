"""Operators: vectorised over Arrow record batches. Users build them through the pipeline API
(``yarnflow``); instances travel to the TaskExecutors inside the job artifact (cloudpickle)."""
