"""The vetted reconstructors, one module a library: `.stdlib`, `.numpy` (with blpickle's own
array and tensor rebuilders), `.pandas`, `.sklearn`; what they share is in `.checks`.
`blpickle.restricted.registry` joins their tables."""
