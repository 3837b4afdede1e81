"""What the monitors conclude: exec format errors (:mod:`.execformat`), escapes from the
placement (:mod:`.escape`), the admission feed (:mod:`.admitted`) and ``explain``
(:mod:`.explain`). The top room: imports :mod:`rules.admit`, :mod:`rules.place` and the
vocabulary; nothing in ``rules/`` imports it (the ``rules-rooms`` contract)."""
