// paper-draws prints, for one seed, the workload and node order of a run of the FGD paper's
// simulator (hkust-adsl/kubernetes-scheduler-simulator, the artifact of Weng et al., USENIX
// ATC '23), drawn with Go's math/rand as that simulator draws them, so bench/
// placement_quality.py can replay the paper's own experiments instead of draws of its own.
//
// What the simulator does with one seed (pkg/simulator/core.go and simulator.go), in order,
// all from one source seeded with the seed:
//
//   - one Int, which it logs;
//   - the pods sorted by name, then shuffled;
//   - the workload tuned to ratio × the cluster's milli-GPU: while the pods ask for more,
//     a pod at a random place is removed; while they ask for less, a pod drawn at random
//     from the name-sorted list is appended, until the next draw's milli-GPU per GPU
//     would take the demand past the target (that draw is not appended);
//   - the nodes sorted by name, and a permutation drawn: the node at sorted place i gets
//     the name prefix perm[i], and ties between nodes go to the smallest name.
//
// Input (stdin, JSON): {"seed", "ratio", "nodes", "node_milli_gpu", "pods": [[milli per
// GPU, milli in all], ...] in name order}. Output (stdout, JSON): {"order": indices into
// the name-sorted pods, in arrival order; "node_rank": perm, by the nodes' sorted place}.
package main

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
)

type request struct {
	Seed         int64      `json:"seed"`
	Ratio        float64    `json:"ratio"`
	Nodes        int        `json:"nodes"`
	NodeMilliGpu int64      `json:"node_milli_gpu"`
	Pods         [][2]int64 `json:"pods"`
}

type draws struct {
	Order    []int `json:"order"`
	NodeRank []int `json:"node_rank"`
}

func draw(req request) draws {
	// math/rand's seeded source gives the same sequence in every Go release (Go 1 promise);
	// the simulator seeded the global source, which is this generator.
	r := rand.New(rand.NewSource(req.Seed))
	r.Int()
	n := len(req.Pods)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	r.Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })

	var asked int64
	for _, pod := range req.Pods {
		asked += pod[1]
	}
	target := req.Ratio * float64(req.NodeMilliGpu)
	if req.Ratio > 0 && float64(asked) > target {
		for float64(asked) > target && len(order) > 0 {
			at := r.Intn(len(order))
			asked -= req.Pods[order[at]][1]
			order = append(order[:at], order[at+1:]...)
		}
	} else if req.Ratio > 0 && float64(asked) < target && n > 0 {
		for {
			idx := r.Intn(n)
			// The simulator compares the milli per GPU here and adds the milli in all.
			if float64(asked+req.Pods[idx][0]) > target {
				break
			}
			asked += req.Pods[idx][1]
			order = append(order, idx)
		}
	}
	return draws{Order: order, NodeRank: r.Perm(req.Nodes)}
}

func main() {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		fmt.Fprintln(os.Stderr, "paper-draws: bad request:", err)
		os.Exit(2)
	}
	if err := json.NewEncoder(os.Stdout).Encode(draw(req)); err != nil {
		fmt.Fprintln(os.Stderr, "paper-draws:", err)
		os.Exit(1)
	}
}
