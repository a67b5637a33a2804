"""The AppMaster process: Dispatcher, ResourceManager (SlotManager + resource driver) and one
JobMaster per job, behind one Thrift port."""
