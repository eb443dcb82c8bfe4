"""The vetted reconstructors, one module a library: `.stdlib`, `.numpy` (with blpickle's own
array and tensor rebuilders), `.pandas`, `.sklearn`, and the state checks of `.scipy` (its
sparse matrices and kernel density); what they share is in `.checks`.
`blpickle.restricted.registry` joins their tables."""
