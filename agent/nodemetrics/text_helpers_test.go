package nodemetrics

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/core/prom"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// parseText parses the text format as Prometheus does (legacy name rules: the strict ones), so the
// agent's families are checked by the reader that scrapes them, not by the writer that made them.
func parseText(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("not valid Prometheus text: %v\n%s", err, text)
	}
	return fams
}

func writeText(t *testing.T, r *prom.Registry) string {
	t.Helper()
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
