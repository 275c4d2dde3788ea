# SPDX-License-Identifier: Apache-2.0
"""ament_python package flowedge_relay: the relay node and its C scheduling core (CFFI). The
benchmarks, drill, demos and training are the package flowedge_relay_tools (tools/)."""

from glob import glob

from setuptools import find_packages, setup

package_name = "flowedge_relay"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(include=[package_name, f"{package_name}.*"]),
    package_data={
        package_name: [
            "models/*.onnx",
            "models/*.json",
            # policy packages: a directory with policy.yaml and its graphs (docs/design.md §10)
            "models/policy_vision/*.onnx",
            "models/policy_vision/*.yaml",
            "models/policy_vision/*.json",
            "models/policy_rtc/*.onnx",
            "models/policy_rtc/*.yaml",
            "models/policy_rtc/*.json",
        ]
    },
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{package_name}"]),
        (f"share/{package_name}", ["package.xml"]),
        (f"share/{package_name}/launch", glob("launch/*.launch.py")),
        (f"share/{package_name}/config", glob("config/*.yaml") + glob("config/*.xml")),
    ],
    setup_requires=["cffi>=1.15"],
    install_requires=["setuptools", "cffi>=1.15", "numpy", "onnxruntime", "PyYAML"],
    cffi_modules=["flowedge_relay/_build_core.py:ffibuilder"],
    zip_safe=False,
    maintainer="FlowEdge Relay maintainers",
    maintainer_email="maintainers@flowedge-relay.org",
    description="Deadline-aware EDF inference relay for flow-matching action policies (ROS 2).",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "flowedge-relayd = flowedge_relay.cli:main",
        ],
    },
)
