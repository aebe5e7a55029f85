package config

import (
	"encoding/json"
	"fmt"
	"time"
)

// Duration is a time.Duration written in YAML and JSON as a Go duration string ("10s", "5m"),
// like metav1.Duration; plain numbers are refused because "10" would silently mean 10ns.
type Duration struct{ time.Duration }

// MarshalJSON writes the duration as a string such as "10s".
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.Duration.String())
}

// UnmarshalJSON reads a Go duration string; the error quotes the bad value.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil // the encoding/json convention: null leaves the value alone
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("invalid duration %s: want a quoted Go duration such as \"10s\"", b)
	}
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

func parseDuration(s string) (time.Duration, error) {
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: want a Go duration such as \"10s\" or \"5m\"", s)
	}
	return v, nil
}
