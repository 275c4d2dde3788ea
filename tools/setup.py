# SPDX-License-Identifier: Apache-2.0
"""ament_python package flowedge_relay_tools: what drives a relay from outside (the demo, the
drill, the robustness campaigns, the benchmarks, policy training), kept out of the runtime
package so that a robot installs the relay without them. Its C drivers (csrc/: the benchmarks'
timing loops, the intake bench's client) are its own small CFFI module, which calls into the
runtime's C core (flowedge_relay_tools/_build_bench.py)."""

from setuptools import find_packages, setup

package_name = "flowedge_relay_tools"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(include=[package_name, f"{package_name}.*"]),
    # the benchmarks' heavier policy (about 1 ms per NFE on one core) and its training record
    package_data={package_name: ["models/*.onnx", "models/*.json"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{package_name}"]),
        (f"share/{package_name}", ["package.xml"]),
    ],
    setup_requires=["cffi>=1.15"],
    install_requires=["setuptools", "cffi>=1.15", "numpy", "onnxruntime", "PyYAML"],
    cffi_modules=["flowedge_relay_tools/_build_bench.py:ffibuilder"],
    # Plots (the benchmarks, the soak) and exporting trained graphs are optional.
    extras_require={"plots": ["matplotlib"], "train": ["onnx"]},
    zip_safe=False,
    maintainer="FlowEdge Relay maintainers",
    maintainer_email="maintainers@flowedge-relay.org",
    description="FlowEdge Relay's benchmarks, stress campaigns, drill, demos and policy training.",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "flowedge-relay-demo-producer = flowedge_relay_tools.demo_producer:main",
            "flowedge-relay-drill = flowedge_relay_tools.drill:main",
            "flowedge_relay_bench = flowedge_relay_tools.bench.__main__:main",
        ],
    },
)
