"""INT8 quantization of IR graphs: calibration, quantization parameters, the accuracy report.

- ``tuner.quant.calibrate``: calibration inputs (seeded random or a .npy/.npz file) and the
  per-tensor ranges of the FP32 graph (methods minmax, percentile, entropy);
- ``workloads.graph.quant_params``: scales and zero points from ranges, per-channel int8 weights;
- ``workloads.graph.passes.quantize``: the pass that rewrites a float graph into 8-bit ops;
- ``tuner.quant.report``: FP32 vs INT8 per quantized op and end to end;
- ``tuner.quant.records``: calibration records (JSON beside the records database).
"""
