package demo

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

var nan = math.NaN()

// read returns the current state of one metric.
func read(m prometheus.Metric) *dto.Metric {
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		return &dto.Metric{}
	}
	return &out
}

// counterValue returns a counter's value.
func counterValue(c prometheus.Counter) float64 { return read(c).GetCounter().GetValue() }

// gaugeValue returns a gauge's value.
func gaugeValue(g prometheus.Gauge) float64 { return read(g).GetGauge().GetValue() }
