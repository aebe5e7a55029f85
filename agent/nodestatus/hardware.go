package nodestatus

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Labels and annotations for the hardware facts a v1.Node has no field for. Label values must be
// short and plain ([A-Za-z0-9._-], 63 characters), so the free text goes into annotations and
// only what a nodeSelector needs (the board, whether the board is throttled) is also a label.
const (
	// AnnotationBoard is the board model as the device tree or DMI names it, e.g.
	// "Raspberry Pi 4 Model B Rev 1.4"; LabelBoard is the same made a label value
	// ("Raspberry-Pi-4-Model-B-Rev-1.4").
	AnnotationBoard = "mqlet.io/board"
	LabelBoard      = "mqlet.io/board"
	// AnnotationSerial is the board's serial number, where it has one.
	AnnotationSerial = "mqlet.io/serial"
	// AnnotationCPU is the processor model, e.g. "ARM Cortex-A72".
	AnnotationCPU = "mqlet.io/cpu"
	// AnnotationMachine is the kernel's machine name (uname -m), e.g. aarch64 under an arm build.
	AnnotationMachine = "mqlet.io/machine"
	// AnnotationTemperature lists each thermal zone's temperature in 5 °C steps, e.g.
	// "cpu-thermal=45C" or "acpitz=30C,x86_pkg_temp=45C" (see Hardware for when it moves).
	AnnotationTemperature = "mqlet.io/temperature"
	// AnnotationThrottled lists the Raspberry Pi firmware's flags that hold now
	// ("under-voltage,throttled", "none"); AnnotationThrottledSinceBoot those that held at some
	// time since boot. LabelThrottled is "true" while any flag holds now, else "false". All three
	// are absent on machines without the firmware's flags.
	AnnotationThrottled          = "mqlet.io/throttled"
	AnnotationThrottledSinceBoot = "mqlet.io/throttled-since-boot"
	LabelThrottled               = "mqlet.io/throttled"
)

// TemperatureStep is the step the temperature annotation moves in: a zone's published value
// changes only when the reading is a full step away from it, so a reading that wavers around a
// boundary (47.4, 47.6, 47.4 °C) does not flip the annotation, and an idle node's status stays
// put. A board heating from 45 to 60 °C changes it three times.
const TemperatureStep = 5.0

// Hardware is what the Hardware setter reads (hw's readers in production).
type Hardware struct {
	CPUModel     string
	Board        hw.Board
	Machine      string
	Temperatures []hw.Temperature
	// Throttling is nil on machines without the Raspberry Pi firmware's flags.
	Throttling *hw.Throttling
}

// HardwareFacts sets the mqlet.io/ labels and annotations from read. It owns every mqlet.io/
// annotation and the mqlet.io/ labels it sets, so it must run after Labels (which resets the
// label set). read may return partial facts with an error (e.g. a malformed throttling file); the
// facts it has are still set.
func HardwareFacts(read func() (Hardware, error)) Setter {
	return func(_ context.Context, n *v1.Node) error {
		h, err := read()
		prevTemp := n.Annotations[AnnotationTemperature]
		ann := map[string]string{}
		for k, v := range n.Annotations {
			if !strings.HasPrefix(k, "mqlet.io/") {
				ann[k] = v
			}
		}
		set := func(k, v string) {
			if v != "" {
				ann[k] = v
			}
		}
		set(AnnotationBoard, h.Board.Model)
		set(AnnotationSerial, h.Board.Serial)
		set(AnnotationCPU, h.CPUModel)
		set(AnnotationMachine, h.Machine)
		set(AnnotationTemperature, temperatureValue(h.Temperatures, prevTemp))
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		if v := labelValue(h.Board.Model); v != "" {
			n.Labels[LabelBoard] = v
		}
		if t := h.Throttling; t != nil {
			ann[AnnotationThrottled] = flagList(t.Active())
			ann[AnnotationThrottledSinceBoot] = flagList(t.Occurred())
			n.Labels[LabelThrottled] = strconv.FormatBool(len(t.Active()) > 0)
		}
		n.Annotations = nil
		if len(ann) > 0 {
			n.Annotations = ann
		}
		if err != nil {
			return fmt.Errorf("hardware facts: %w", err)
		}
		return nil
	}
}

func flagList(flags []string) string {
	if len(flags) == 0 {
		return "none"
	}
	return strings.Join(flags, ",")
}

// temperatureValue renders the zones' readings in TemperatureStep steps, keeping a zone's
// previously published value (from prev, the annotation as it was) while its reading stays within
// a step of it. Zones of the same type are told apart by a suffix: acpitz, acpitz-2.
func temperatureValue(temps []hw.Temperature, prev string) string {
	published := map[string]float64{}
	for _, part := range strings.Split(prev, ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			continue
		}
		if c, err := strconv.ParseFloat(strings.TrimSuffix(v, "C"), 64); err == nil {
			published[k] = c
		}
	}
	seen := map[string]int{}
	parts := make([]string, 0, len(temps))
	for _, t := range temps {
		key := strings.NewReplacer(",", "_", "=", "_").Replace(t.Type)
		seen[key]++
		if seen[key] > 1 {
			key += "-" + strconv.Itoa(seen[key])
		}
		v := TemperatureStep * math.Round(t.Celsius/TemperatureStep)
		if p, ok := published[key]; ok && math.Abs(t.Celsius-p) < TemperatureStep {
			v = p
		}
		parts = append(parts, key+"="+strconv.FormatFloat(v, 'f', -1, 64)+"C")
	}
	return strings.Join(parts, ",")
}

// labelValue makes s a valid label value: runs of other characters become '-', the ends are
// trimmed to alphanumerics, and the length cut to 63. Empty if nothing is left.
func labelValue(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range s {
		ok := r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
		if !ok {
			if !dash {
				b.WriteByte('-')
				dash = true
			}
			continue
		}
		b.WriteRune(r)
		dash = r == '-'
	}
	v := b.String()
	if len(v) > validation.LabelValueMaxLength {
		v = v[:validation.LabelValueMaxLength]
	}
	v = strings.TrimFunc(v, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	})
	if len(validation.IsValidLabelValue(v)) > 0 {
		return ""
	}
	return v
}
