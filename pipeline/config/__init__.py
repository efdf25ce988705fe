"""The config layer: the validated ``Config`` (``model``), its documentation (``docs``),
the back-end plug-ins (``backends``) and the population mix (``population_mix``). Each
package below owns its own section; this one composes them."""
