"""Quality bench: time-to-target-loss for AdamW, Muon, MOP and SOAP-REKLS on real text available offline."""
