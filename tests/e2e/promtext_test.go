package e2e

// Reading Prometheus' text exposition format, as the bench's diagnostics read the API
// server's and kube-scheduler's /metrics.

import (
	"bufio"
	"regexp"
	"strconv"
	"strings"
)

// promSample is one sample line: the metric's name, its labels and its value.
type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

var (
	promLine  = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$`)
	promLabel = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// promSamples are the samples of text whose metric name keep accepts (comments, other
// metrics and unparsable values are skipped).
func promSamples(text string, keep func(name string) bool) []promSample {
	var out []promSample
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := promLine.FindStringSubmatch(sc.Text())
		if m == nil || !keep(m[1]) {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range promLabel.FindAllStringSubmatch(m[2], -1) {
			labels[l[1]] = l[2]
		}
		out = append(out, promSample{name: m[1], labels: labels, value: v})
	}
	return out
}
