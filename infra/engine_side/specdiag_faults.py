"""A vLLM general plugin that injects engine-side faults, to reproduce a broken integration on purpose.

Installed into the embedded engine's virtualenv (entry point `vllm.general_plugins`); inert unless asked for:

  SPECDIAG_FAULT_AUX_LAYERS=0,1,2   feed EAGLE-3 drafters the hidden states of these target layers, whatever
                                    their config names: what a faulty engine patch does. vLLM still logs
                                    "Using auxiliary layers from speculative config: <the config's ids>".
"""
import logging
import os

logger = logging.getLogger("specdiag.faults")


def register() -> None:
    spec = os.environ.get("SPECDIAG_FAULT_AUX_LAYERS", "").strip()
    if not spec:
        return
    layers = tuple(int(x) for x in spec.split(","))
    from vllm.model_executor.models import interfaces

    original = interfaces.EagleModelMixin._set_aux_hidden_state_layers
    if getattr(original, "specdiag_fault", False):  # plugins load once per process, but be safe
        return

    def faulty(self, requested):
        logger.warning("specdiag fault injection: EAGLE-3 aux hidden states taken from layers %s, not %s",
                       layers, tuple(requested))
        original(self, layers)

    faulty.specdiag_fault = True
    interfaces.EagleModelMixin._set_aux_hidden_state_layers = faulty
