"""Block-based open mode: fixed-size blocks of one blob version, a RAM tier, shared in-flight
fetches and read-ahead."""
