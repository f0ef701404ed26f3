package e2e

// Pending pods explain themselves (issue 39 part 3): kube-scheduler copies the extender's
// per-node reasons into the pod's FailedScheduling event, and those reasons say what the pod
// asks and the node lacks. The expected words are computed here from the API objects alone
// (the holders' device-allocated annotations and the machine's shape), never from the
// extender's code.

import (
	"fmt"
	"strconv"
	"testing"
)

// shareWords is the extender's reason for a GPU share no card holds, from each card's free
// share (hundredths of a card): the nearest card's free share banded in tens (cut below the
// ask), and "fragmented" when the cards together hold the ask. No "%": kube-scheduler uses the
// reason as its event's format string.
func shareWords(free []int64, ask int64) string {
	var largest, total, partly int64
	for _, f := range free {
		if f > largest {
			largest = f
		}
		total += f
		if f > 0 {
			partly++
		}
	}
	if largest == 0 {
		return fmt.Sprintf("insufficient gpu devices: no card has free gpu-memory-ratio, pod asks %d", ask)
	}
	low := largest / 10 * 10
	high := min(low+9, ask-1)
	band := fmt.Sprintf("%d-%d of 100", low, high)
	if high <= low {
		band = fmt.Sprintf("%d of 100", low)
	}
	if total >= ask && partly > 1 {
		return fmt.Sprintf("insufficient gpu devices: fragmented, %d cards partly free, largest free gpu-memory-ratio on one card %s, pod asks %d", partly, band, ask)
	}
	return fmt.Sprintf("insufficient gpu devices: largest free gpu-memory-ratio on one card %s, pod asks %d", band, ask)
}

func TestPendingPodsSayWhatIsMissing(t *testing.T) {
	t.Parallel()
	cp, ext := start(t, planOptions{})
	m := gpuMachine
	cp.addNodes("full", 1, m)
	ext.waitReady()

	// Eight holders of 70 % each: wherever the extender put them, the cards' free shares are
	// read back from their annotations.
	var holders []string
	for i := 0; i < m.gpus; i++ {
		name := fmt.Sprintf("hold-%d", i)
		holders = append(holders, name)
		cp.createPod(podSpec{name: name, limits: map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-memory-ratio": "70"}})
	}
	bound := cp.waitBound(holders...)
	free := make([]int64, m.gpus)
	for i := range free {
		free[i] = 100
	}
	for _, p := range bound {
		devs, err := parseDeviceAllocated(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range devs["gpu"] {
			used, err := strconv.ParseInt(e.Resources["koordinator.sh/gpu-memory-ratio"], 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", p.Name, err)
			}
			free[e.Minor] -= used
		}
	}
	wholeFree := 0
	for _, f := range free {
		if f == 100 {
			wholeFree++
		}
	}
	t.Logf("free share per card: %v", free)

	// A share of 50 %: no card has it.
	cp.createPod(podSpec{name: "share-50", limits: map[string]string{"cpu": "1", "memory": "1Gi", "koordinator.sh/gpu-memory-ratio": "50"}})
	want := "1 " + shareWords(free, 50)
	t.Logf("share-50: %s", cp.waitEvent("share-50", want))

	// Two whole GPUs: kube-scheduler's own fit passes (nvidia.com/gpu is advertised, the
	// shares do not use it); the extender counts the wholly free cards.
	cp.createPod(podSpec{name: "whole-2", limits: map[string]string{"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2"}})
	wholeWords := fmt.Sprintf("%d whole gpus free", wholeFree)
	switch wholeFree {
	case 0:
		wholeWords = "no whole gpu free"
	case 1:
		wholeWords = "1 whole gpu free"
	}
	want = "1 insufficient gpu devices: " + wholeWords + ", pod asks 2"
	t.Logf("whole-2: %s", cp.waitEvent("whole-2", want))

	// Five whole GPUs on one NUMA node, on an empty machine with four per NUMA node. The two
	// pods above go first, so the new node stays empty.
	cp.deletePodNow("share-50")
	cp.deletePodNow("whole-2")
	cp.waitGone("share-50")
	cp.waitGone("whole-2")
	cp.addNodes("split", 1, m)
	cp.createPod(podSpec{name: "numa-5",
		limits: map[string]string{"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "5"},
		annots: map[string]string{"scheduling.koordinator.sh/numa-topology-spec": `{"numaTopologyPolicy":"SingleNUMANode"}`}})
	perNuma := m.gpus / m.numa
	want = fmt.Sprintf(": %d whole gpus free over %d NUMA nodes, at most %d on one, pod asks 5 (SingleNUMANode)", m.gpus, m.numa, perNuma)
	t.Logf("numa-5: %s", cp.waitEvent("numa-5", want))
	cp.assertNoViolations()
}
