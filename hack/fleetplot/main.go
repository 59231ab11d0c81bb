// Command fleetplot draws the fleet bench's figures (the "fleet" key of
// bench-results.json, written by `make fleet-bench`) as one PNG: rollout
// time and API requests per second during the rollout against the number
// of nodes K, one line per --max-concurrent N. A module of its own, so the
// plotting library stays out of the agent's module graph.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"os"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

type run struct {
	Nodes                 int     `json:"nodes"`
	MaxConcurrent         int     `json:"maxConcurrent"`
	RolloutSeconds        float64 `json:"rolloutSeconds"`
	RolloutRequestsPerSec float64 `json:"rolloutRequestsPerSec"`
}

func main() {
	in := flag.String("i", "bench-results.json", "the results file")
	out := flag.String("o", "docs/fleet-bench.png", "the PNG to write")
	flag.Parse()
	if err := render(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "fleetplot:", err)
		os.Exit(1)
	}
}

func render(in, out string) error {
	raw, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var doc struct {
		Fleet *struct {
			Machine string `json:"machine"`
			Date    string `json:"date"`
			Runs    []run  `json:"runs"`
		} `json:"fleet"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if doc.Fleet == nil || len(doc.Fleet.Runs) == 0 {
		return fmt.Errorf("%s has no fleet runs (run make fleet-bench)", in)
	}
	byN := map[int][]run{}
	for _, r := range doc.Fleet.Runs {
		byN[r.MaxConcurrent] = append(byN[r.MaxConcurrent], r)
	}
	var ns []int
	for n := range byN {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	panel := func(title, ylabel string, y func(run) float64) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "nodes K"
		p.Y.Label.Text = ylabel
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.XOffs, p.Legend.YOffs = vg.Millimeter*4, -vg.Millimeter*2
		for i, n := range ns {
			rs := byN[n]
			sort.Slice(rs, func(a, b int) bool { return rs[a].Nodes < rs[b].Nodes })
			pts := make(plotter.XYs, len(rs))
			for j, r := range rs {
				pts[j].X, pts[j].Y = float64(r.Nodes), y(r)
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return nil, err
			}
			c := palette[i%len(palette)]
			line.Color, points.Color = c, c
			line.Width = vg.Points(1.5)
			points.Shape = draw.CircleGlyph{}
			p.Add(line, points)
			p.Legend.Add(fmt.Sprintf("--max-concurrent %d", n), line, points)
		}
		return p, nil
	}
	left, err := panel("Pool-wide change: time until every node succeeds", "seconds", func(r run) float64 { return r.RolloutSeconds })
	if err != nil {
		return err
	}
	right, err := panel("API server load during the rollout", "requests / s", func(r run) float64 { return r.RolloutRequestsPerSec })
	if err != nil {
		return err
	}
	const w, h = 12 * vg.Inch, 4.5 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 8}
	canvases := plot.Align([][]*plot.Plot{{left, right}}, tiles, dc)
	left.Draw(canvases[0][0])
	right.Draw(canvases[0][1])
	caption := fmt.Sprintf("sim:h200x8 nodes, each a real mig-agent process, one real kube-apiserver; %s, %s", doc.Fleet.Machine, doc.Fleet.Date)
	sty := draw.TextStyle{Color: color.Gray{Y: 80}, Font: plot.DefaultFont, Handler: plot.DefaultTextHandler}
	sty.Font.Size = vg.Points(9)
	dc.FillText(sty, vg.Point{X: vg.Millimeter * 4, Y: vg.Millimeter * 2}, caption)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}
