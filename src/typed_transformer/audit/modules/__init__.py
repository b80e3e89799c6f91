"""Auditing attention modules: a module's description (:class:`ModuleSpec`), its weights read into the reference, the
reference math of each feature modules add (rotary, ALiBi, relative positions, latent and differential attention,
gates), the adapter that calls a module, and its repro."""
