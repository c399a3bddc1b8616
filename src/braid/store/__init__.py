"""braid's store: files and batch jobs now, stored responses later (:mod:`braid.store.db`)."""
