"""The placement rules: what the product decides and how it writes it, shared by the
controller and the webhook. Platform extraction and intersection, the placement of one pod
as facts and its three renderings (the controller's PATCH, the webhook's admission patch,
the admission policy's CEL), affinity merging, NUMA fit and score, the config model and the
names, the admission objects as data. Plain Kubernetes dicts and frozen dataclasses in and
out, no I/O: the controller's and the webhook's I/O modules import these, never the reverse
(the ``rules`` contract in ``.importlinter``)."""
