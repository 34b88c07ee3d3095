"""Controllers managed by their GVRs' availability (ControllerManager, workqueue, controller helper)."""
